<?php

/**
 * One operator verb on one task, through gorge-taskqueue's API: a
 * confirmation dialog, then (on a CSRF-checked form post) the call, logged
 * in Phorge's activity log and, through X-Request-Id, in the daemon's.
 */
final class GorgeConsoleTaskActionController extends GorgeConsoleController {

  public function handleRequest(AphrontRequest $request) {
    $verb = $request->getURIData('verb');
    $id = (int)$request->getURIData('id');
    $viewer = $this->getViewer();
    $done_uri = $this->getApplicationURI('tasks/');

    $queue = GorgeDaemon::loadDaemon(GorgeDaemon::TASKQUEUE);
    if (!$queue) {
      return $this->newNotConfiguredDialog(
        'taskqueue', pht('act on tasks'), $done_uri);
    }

    $errors = array();
    $priority = $request->getStr('priority');
    if ($request->isFormPost()) {
      $body = array('taskID' => $id);
      if ($verb === 'priority') {
        if (!preg_match('/^\d{1,9}$/', (string)$priority)) {
          $errors[] = pht('The priority must be a whole number, 0 or more.');
        }
        $body['priority'] = (int)$priority;
      }
      if ($verb === 'requeue') {
        $body = array('taskIDs' => array($id));
      }

      if (!$errors) {
        $request_id = GorgeDaemon::newActorRequestID($viewer);
        $future = $queue->newFuture(
          'POST', '/api/queue/'.$verb, array(), $body, null)
          ->addHeader('X-Request-Id', $request_id);
        $answer = GorgeDaemonAnswer::newFromFuture($future);
        $refusal = $this->getRefusal($verb, $answer);

        $this->logAction(
          array(
            'daemon' => $queue->getDisplayName(),
            'action' => $verb,
            'taskID' => $id,
            'priority' => ($verb === 'priority') ? (int)$priority : null,
            'requestID' => $request_id,
            'httpStatus' => $answer->getHTTPStatus(),
            'outcome' => ($refusal === null) ? 'done' : $refusal,
          ));

        if ($refusal === null) {
          return id(new AphrontRedirectResponse())->setURI($done_uri);
        }
        $errors[] = $refusal;
      }
    }

    $dialog = $this->newDialog()
      ->setTitle($this->getVerbTitle($verb, $id))
      ->setErrors($errors)
      ->appendParagraph($this->getVerbExplanation($verb))
      ->addSubmitButton($this->getVerbTitle($verb, $id))
      ->addCancelButton($done_uri);

    if ($verb === 'priority') {
      $task = id(new PhabricatorWorkerActiveTask())->load($id);
      if ($priority === null && $task) {
        $priority = $task->getPriority();
      }
      $form = id(new AphrontFormView())
        ->setViewer($viewer)
        ->appendChild(
          id(new AphrontFormTextControl())
            ->setLabel(pht('Priority'))
            ->setName('priority')
            ->setValue($priority)
            ->setCaption(
              pht(
                'Lower runs first: %d alerts, %d default, %d bulk, %d import.',
                PhabricatorWorker::PRIORITY_ALERTS,
                PhabricatorWorker::PRIORITY_DEFAULT,
                PhabricatorWorker::PRIORITY_BULK,
                PhabricatorWorker::PRIORITY_IMPORT)));
      $dialog->appendForm($form);
    }

    return $dialog;
  }

  private function getRefusal($verb, GorgeDaemonAnswer $answer) {
    if (!$answer->isOK()) {
      return $answer->describeFailure();
    }
    if ($verb !== 'requeue') {
      return null;
    }
    // One entry per task: "requeued", or "refused" with code and message.
    $entry = head((array)$answer->getData());
    if (is_array($entry) && idx($entry, 'status') === 'requeued') {
      return null;
    }
    return pht(
      'refused: %s %s',
      idx((array)$entry, 'code'),
      idx((array)$entry, 'message'));
  }

  private function getVerbTitle($verb, $id) {
    switch ($verb) {
      case 'requeue':
        return pht('Requeue Task %d', $id);
      case 'retry':
        return pht('Retry Task %d', $id);
      case 'cancel':
        return pht('Cancel Task %d', $id);
      case 'free':
        return pht('Free Task %d', $id);
      default:
        return pht('Set Priority of Task %d', $id);
    }
  }

  private function getVerbExplanation($verb) {
    switch ($verb) {
      case 'requeue':
        return pht(
          'A new task is made from this failed task: same class, data and '.
          'priority, no failures. The archived task stays as history.');
      case 'retry':
        return pht(
          'The archived task becomes active again under its own id, with no '.
          'failures, and runs at once.');
      case 'cancel':
        return pht(
          'The task is archived as cancelled and never runs, whoever holds it.');
      case 'free':
        return pht(
          'The lease is broken and the task can be leased again at once; a '.
          'worker still running it stops at its next renewal.');
      default:
        return pht('The task keeps its place among tasks of its new priority.');
    }
  }

}
