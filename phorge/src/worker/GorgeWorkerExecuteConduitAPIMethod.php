<?php

/**
 * `worker.execute`: gorge-worker hands a task it leased from gorge-taskqueue
 * back to PHP, and reports the answer to the queue itself.
 *
 * Parameters and answers are the ones gorge-worker sends and expects (gorge's
 * docs/worker.md). The method runs any worker class with the data given, so
 * only administrators (the worker's bot account) may call it.
 */
final class GorgeWorkerExecuteConduitAPIMethod extends ConduitAPIMethod {

  const ERR_NO_TASK_CLASS = 'ERR-NO-TASK-CLASS';
  const ERR_NOT_ADMIN = 'ERR-NOT-ADMIN';
  const ERR_BAD_PARAMETER = 'ERR-BAD-PARAMETER';

  public function getAPIMethodName() {
    return 'worker.execute';
  }

  public function getMethodSummary() {
    return pht('Run one queued task in PHP on behalf of gorge-worker.');
  }

  public function getMethodDescription() {
    return pht(
      'Runs one task of the worker queue once, in this web process, and '.
      'answers with its outcome: `success`, `yield` (with `retry`, the '.
      'seconds to wait), `failure` (with `failureReason` and, when the '.
      'worker defines one, `retry`) or `permanent-failure` (with '.
      '`failureReason`).'.
      "\n\n".
      'This method is called by gorge-worker, which leases the task from '.
      'gorge-taskqueue and records the outcome there; it never changes the '.
      'row of the task it runs. Tasks the running task schedules directly '.
      'are queued as usual; the follow-ups it stages with queueTask() are '.
      'queued here too, or, with `returnFollowups`, handed back under '.
      '`followups` for gorge-taskqueue to enqueue with the archive.'.
      "\n\n".
      'Only administrators may call it. An empty `taskClass` runs nothing '.
      'and answers `%s`, which gorge-worker uses as a readiness check.',
      self::ERR_NO_TASK_CLASS);
  }

  public function getApplication() {
    return PhabricatorApplication::getByClass(
      PhabricatorDaemonsApplication::class);
  }

  protected function defineParamTypes() {
    return array(
      'taskID' => 'optional int',
      'taskClass' => 'required string',
      'data' => 'optional string',
      'returnFollowups' => 'optional bool',
    );
  }

  protected function defineReturnType() {
    return 'map<string, wild>';
  }

  protected function defineErrorTypes() {
    return array(
      self::ERR_NOT_ADMIN => pht(
        'Only an administrator may run tasks. Make the account whose API '.
        'token gorge-worker uses (GORGE_WORKER_CONDUIT_TOKEN) an '.
        'administrator.'),
      self::ERR_NO_TASK_CLASS => pht(
        'No task class was given (taskClass is empty or not a string), so '.
        'nothing ran.'),
      self::ERR_BAD_PARAMETER => pht(
        'A parameter has the wrong type: taskID must be an integer and data '.
        'a string holding the task\'s data as JSON text.'),
    );
  }

  protected function execute(ConduitAPIRequest $request) {
    $viewer = $request->getUser();
    if (!$viewer->getIsAdmin()) {
      throw new ConduitException(self::ERR_NOT_ADMIN);
    }

    $task_class = $request->getValue('taskClass');
    if (!is_string($task_class) || !strlen($task_class)) {
      throw new ConduitException(self::ERR_NO_TASK_CLASS);
    }

    $task_id = $request->getValue('taskID');
    if ($task_id !== null && !is_int($task_id)) {
      throw id(new ConduitException(self::ERR_BAD_PARAMETER))
        ->setErrorDescription(
          pht(
            'Parameter "taskID" must be an integer, got %s.',
            phutil_describe_type($task_id)));
    }

    $data = $request->getValue('data');
    if ($data !== null && !is_string($data)) {
      throw id(new ConduitException(self::ERR_BAD_PARAMETER))
        ->setErrorDescription(
          pht(
            'Parameter "data" must be a string holding the task\'s data as '.
            'JSON text, got %s.',
            phutil_describe_type($data)));
    }

    return id(new GorgeWorkerTaskRunner())
      ->setTaskID($task_id)
      ->setTaskClass($task_class)
      ->setRawData($data)
      ->setReturnFollowups((bool)$request->getValue('returnFollowups'))
      ->run();
  }

}
