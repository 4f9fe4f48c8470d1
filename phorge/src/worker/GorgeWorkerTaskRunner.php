<?php

/**
 * Runs one queued task in this process, once, for gorge-worker, and
 * describes the outcome in the shape `worker.execute` answers with.
 *
 * gorge-taskqueue owns the task's row: it leased the task, and it records
 * the outcome (archive, failure count, retry time) when gorge-worker reports
 * it. So this class reads that row at most, and never calls
 * PhabricatorWorkerActiveTask::executeTask(), which writes it.
 *
 * Follow-ups (tasks the worker stages with queueTask()) are either queued
 * here, after success, as Phorge's taskmaster does; or, with
 * setReturnFollowups(true), handed back in the answer under "followups", so
 * that gorge-taskqueue archives the task and queues them in one transaction
 * (a crash between the two can then neither lose nor double them). Tasks the
 * running task schedules directly (PhabricatorWorker::scheduleTask()) are
 * written the normal way in either case.
 */
final class GorgeWorkerTaskRunner extends Phobject {

  const RESULT_SUCCESS = 'success';
  const RESULT_YIELD = 'yield';
  const RESULT_FAILURE = 'failure';
  const RESULT_PERMANENT_FAILURE = 'permanent-failure';

  private $taskID;
  private $taskClass;
  private $rawData;
  private $taskFields;
  private $returnFollowups = false;

  public function setTaskID($task_id) {
    $this->taskID = $task_id;
    return $this;
  }

  public function getTaskID() {
    return $this->taskID;
  }

  public function setTaskClass($task_class) {
    $this->taskClass = $task_class;
    return $this;
  }

  public function getTaskClass() {
    return $this->taskClass;
  }

  /**
   * The task's data as stored: JSON text of any shape (an object, a list,
   * a bare string or number), or an empty string for a task without data.
   */
  public function setRawData($raw_data) {
    $this->rawData = $raw_data;
    return $this;
  }

  public function getRawData() {
    return $this->rawData;
  }

  /**
   * The task's row as the caller leased it (failureCount, priority,
   * objectPHID, containerPHID, dateCreated, failureTime, dataID), so that the
   * row need not be read again. Without it the row is loaded by ID.
   *
   * @param map<string, wild>|null $fields
   */
  public function setTaskFields($fields) {
    $this->taskFields = $fields;
    return $this;
  }

  public function getTaskFields() {
    return $this->taskFields;
  }

  public function setReturnFollowups($return_followups) {
    $this->returnFollowups = (bool)$return_followups;
    return $this;
  }

  public function getReturnFollowups() {
    return $this->returnFollowups;
  }

  /**
   * @return map<string, wild> The answer of `worker.execute`.
   */
  public function run() {
    $started = microtime(true);
    $result = $this->runTask();
    $result['duration'] = phutil_microseconds_since($started);
    return $result;
  }

  private function runTask() {
    $class = $this->getTaskClass();

    $problem = $this->describeUnrunnableClass($class);
    if ($problem !== null) {
      return $this->newPermanentFailure($problem);
    }

    // Plain json_decode, as Phorge itself reads task data: it accepts the
    // bare scalars some workers store (PhabricatorMetaMTAWorker keeps only
    // a mail ID).
    $raw_data = $this->getRawData();
    $data = null;
    if (phutil_nonempty_string($raw_data)) {
      $data = json_decode($raw_data, true);
      if (json_last_error() !== JSON_ERROR_NONE) {
        return $this->newPermanentFailure(
          pht(
            'Task data for "%s" is not valid JSON: %s',
            $class,
            json_last_error_msg()));
      }
    }

    $task = $this->newTaskView($class, $data);
    $failure_count = (int)$task->getFailureCount();

    $worker = newv($class, array($data));
    $worker->setCurrentWorkerTask($task);

    try {
      // The same cap Phorge's taskmasters apply before they run a task.
      $maximum_failures = $worker->getMaximumRetryCount();
      if ($maximum_failures !== null && $failure_count > $maximum_failures) {
        throw new PhabricatorWorkerPermanentFailureException(
          pht(
            'Task %s has exceeded the maximum number of failures (%d).',
            $this->describeTaskID(),
            $maximum_failures));
      }

      $worker->executeTask();
    } catch (PhabricatorWorkerPermanentFailureException $ex) {
      return $this->newPermanentFailure($this->describeException($ex));
    } catch (PhabricatorWorkerYieldException $ex) {
      return array(
        'result' => self::RESULT_YIELD,
        'retry' => (int)$ex->getDuration(),
      );
    } catch (Exception $ex) {
      return $this->newFailure($worker, $task, $ex);
    } catch (Throwable $ex) {
      return $this->newFailure($worker, $task, $ex);
    }

    // Follow-up tasks get this task's priority unless they ask for another,
    // as under Phorge's own taskmasters.
    $defaults = array();
    if ($task->getPriority() !== null) {
      $defaults['priority'] = (int)$task->getPriority();
    }

    if ($this->getReturnFollowups()) {
      try {
        $followups = $this->describeFollowups($worker, $defaults);
      } catch (Exception $ex) {
        return $this->newFailure($worker, $task, $ex);
      } catch (Throwable $ex) {
        return $this->newFailure($worker, $task, $ex);
      }
      return array(
        'result' => self::RESULT_SUCCESS,
        'followups' => $followups,
      );
    }

    try {
      $worker->flushTaskQueue($defaults);
    } catch (Exception $ex) {
      // The work is done but its follow-ups are not all queued: running
      // the task again is better than losing them.
      return $this->newFailure($worker, $task, $ex);
    } catch (Throwable $ex) {
      return $this->newFailure($worker, $task, $ex);
    }

    return array(
      'result' => self::RESULT_SUCCESS,
    );
  }

  /**
   * The tasks the worker staged with queueTask(), in the shape
   * gorge-taskqueue enqueues: data as the JSON text Phorge would store.
   */
  private function describeFollowups(PhabricatorWorker $worker, $defaults) {
    // getQueuedTasks() is final protected: read it from the worker's scope.
    $read = function () {
      return $this->getQueuedTasks();
    };
    $queued = $read->call($worker);

    $followups = array();
    foreach ($queued as $spec) {
      list($class, $data, $options) = $spec;
      $options = (array)$options + $defaults;
      $followups[] = array(
        'taskClass' => (string)$class,
        // What PhabricatorWorkerTaskData writes (Lisk's JSON serialization).
        'data' => phutil_json_encode($data),
        'priority' => idx($options, 'priority'),
        'objectPHID' => idx($options, 'objectPHID'),
        'containerPHID' => idx($options, 'containerPHID'),
        'delayUntil' => idx($options, 'delayUntil') ? (int)$options['delayUntil'] : null,
      );
    }
    return $followups;
  }

  private function describeUnrunnableClass($class) {
    try {
      $exists = class_exists($class);
    } catch (PhutilMissingSymbolException $ex) {
      $exists = false;
    }

    if (!$exists) {
      return pht('Task class "%s" does not exist.', $class);
    }

    if (!is_subclass_of($class, PhabricatorWorker::class)) {
      return pht(
        'Task class "%s" is not a subclass of "%s".',
        $class,
        PhabricatorWorker::class);
    }

    $reflection = new ReflectionClass($class);
    if ($reflection->isAbstract()) {
      return pht('Task class "%s" is abstract.', $class);
    }

    return null;
  }

  /**
   * An unsaved copy of the task as its row stands, for the worker to inspect
   * (ID, failure count, priority). The row itself is only read.
   */
  private function newTaskView($class, $data) {
    $task = id(new PhabricatorWorkerActiveTask())
      ->setTaskClass($class)
      ->setData($data)
      ->setFailureCount(0);

    $task_id = $this->getTaskID();
    if ($task_id === null) {
      return $task;
    }

    $task->setID((int)$task_id);

    $fields = $this->getTaskFields();
    if ($fields !== null) {
      $task
        ->setFailureCount((int)idx($fields, 'failureCount', 0))
        ->setFailureTime(idx($fields, 'failureTime'))
        ->setPriority(idx($fields, 'priority'))
        ->setDataID(idx($fields, 'dataID'))
        ->setObjectPHID(idx($fields, 'objectPHID'))
        ->setContainerPHID(idx($fields, 'containerPHID'))
        ->setDateCreated(idx($fields, 'dateCreated'));
      return $task;
    }

    $row = id(new PhabricatorWorkerActiveTask())->load((int)$task_id);
    if ($row) {
      $task
        ->setFailureCount((int)$row->getFailureCount())
        ->setFailureTime($row->getFailureTime())
        ->setPriority($row->getPriority())
        ->setDataID($row->getDataID())
        ->setObjectPHID($row->getObjectPHID())
        ->setContainerPHID($row->getContainerPHID())
        ->setDateCreated($row->getDateCreated());
    }

    return $task;
  }

  private function newFailure(
    PhabricatorWorker $worker,
    PhabricatorWorkerActiveTask $task,
    $ex) {

    // Phorge counts this failure before it asks the worker how long to wait,
    // so the wait grows with the count the same way here.
    $task
      ->setExecutionException($ex)
      ->setFailureCount($task->getFailureCount() + 1)
      ->setFailureTime(time());

    $result = array(
      'result' => self::RESULT_FAILURE,
      'failureType' => 'transient',
      'failureReason' => $this->describeException($ex),
    );

    try {
      $retry = $worker->getWaitBeforeRetry($task);
    } catch (Exception $retry_ex) {
      $retry = null;
    } catch (Throwable $retry_ex) {
      $retry = null;
    }

    if ($retry !== null) {
      $result['retry'] = max(0, (int)$retry);
    }

    return $result;
  }

  private function newPermanentFailure($reason) {
    return array(
      'result' => self::RESULT_PERMANENT_FAILURE,
      'failureType' => 'permanent',
      'failureReason' => $reason,
    );
  }

  private function describeException($ex) {
    $message = (string)$ex->getMessage();
    if (!strlen($message)) {
      // Some workers fail without a message; the class still says why.
      return get_class($ex);
    }
    if ($ex instanceof Exception) {
      return $message;
    }
    // A PHP error (TypeError and the like): its class is half the story.
    return pht('%s: %s', get_class($ex), $message);
  }

  private function describeTaskID() {
    $task_id = $this->getTaskID();
    if ($task_id === null) {
      return pht('(no ID)');
    }
    return (string)$task_id;
  }

}
