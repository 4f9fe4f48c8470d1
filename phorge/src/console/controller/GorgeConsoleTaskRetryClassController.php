<?php

/**
 * Retry the dead tasks of one class: choose the class, see how many tasks
 * that is, then confirm. Each goes back under its own id
 * (/api/queue/retry), which also removes its archive row, so confirming the
 * same step twice cannot run a task twice.
 */
final class GorgeConsoleTaskRetryClassController
  extends GorgeConsoleController {

  // One page of /api/queue/archived; the rest waits for the next round.
  const LIMIT = 500;

  public function handleRequest(AphrontRequest $request) {
    $viewer = $this->getViewer();
    $done_uri = $this->getApplicationURI('tasks/');
    $queue = GorgeDaemon::loadDaemon(GorgeDaemon::TASKQUEUE);
    if (!$queue) {
      return $this->newNotConfiguredDialog(
        'taskqueue', pht('act on tasks'), $done_uri);
    }

    $step = $request->getStr('step');
    $class = $request->getStr('taskClass');

    if ($request->isFormPost() && $step === 'confirm') {
      $ids = array_slice(
        array_filter(array_map('intval', explode(',', $request->getStr('ids')))),
        0,
        self::LIMIT);
      return $this->retry($queue, $class, $ids, $done_uri);
    }

    if ($request->isFormPost() && $step === 'preview' && strlen($class)) {
      $dead = $this->loadDead($queue, $class);
      if (!is_array($dead)) {
        return $this->newDialog()
          ->setTitle(pht('gorge-taskqueue Did Not Answer'))
          ->appendParagraph($dead)
          ->addCancelButton($done_uri);
      }
      $ids = ipull($dead, 'id');
      $dialog = $this->newDialog()
        ->setTitle(pht('Retry Dead %s Tasks', $class))
        ->addHiddenInput('step', 'confirm')
        ->addHiddenInput('taskClass', $class)
        ->addHiddenInput('ids', implode(',', $ids))
        ->addCancelButton($done_uri);
      if (!$ids) {
        return $dialog->appendParagraph(
          pht('No task of this class is archived as failed.'));
      }
      return $dialog
        ->appendParagraph(
          pht(
            '%s dead task(s) of class %s go back into the queue under their '.
            'own ids, with no failures.%s',
            phutil_count($ids),
            $class,
            (count($ids) >= self::LIMIT)
              ? ' '.pht('(The first %d; run this again for the rest.)', self::LIMIT)
              : ''))
        ->addSubmitButton(pht('Retry %s Tasks', phutil_count($ids)));
    }

    // The first step: which class.
    $dead = $this->loadDead($queue, null);
    $options = array();
    if (is_array($dead)) {
      foreach ($dead as $task) {
        $name = idx($task, 'taskClass');
        $options[$name] = idx($options, $name, 0) + 1;
      }
    }
    if (!$options) {
      return $this->newDialog()
        ->setTitle(pht('Retry Dead Tasks by Class'))
        ->appendParagraph(
          is_array($dead) ? pht('No task is archived as failed.') : $dead)
        ->addCancelButton($done_uri);
    }
    foreach ($options as $name => $count) {
      $options[$name] = pht('%s (%s among the latest)', $name, $count);
    }

    $form = id(new AphrontFormView())
      ->setViewer($viewer)
      ->appendChild(
        id(new AphrontFormSelectControl())
          ->setLabel(pht('Class'))
          ->setName('taskClass')
          ->setOptions($options));

    return $this->newDialog()
      ->setTitle(pht('Retry Dead Tasks by Class'))
      ->addHiddenInput('step', 'preview')
      ->appendForm($form)
      ->addSubmitButton(pht('Count Them'))
      ->addCancelButton($done_uri);
  }

  /**
   * The newest archived failures (of one class), or why they could not be
   * read.
   */
  private function loadDead(GorgeDaemon $queue, $class) {
    $query = array('result' => 'failure', 'limit' => self::LIMIT);
    if ($class !== null) {
      $query['class'] = $class;
    }
    $answer = $queue->call('GET', '/api/queue/archived', $query);
    if (!$answer->isOK()) {
      return $answer->describeFailure();
    }
    return (array)$answer->getData();
  }

  private function retry(GorgeDaemon $queue, $class, array $ids, $done_uri) {
    $viewer = $this->getViewer();
    $request_id = GorgeDaemon::newActorRequestID($viewer);

    $bodies = array();
    foreach ($ids as $id) {
      $bodies[$id] = array('taskID' => $id);
    }
    list($retried, $refused) = $this->callEach(
      $queue, '/api/queue/retry', $bodies, $request_id);

    $this->logAction(
      array(
        'daemon' => $queue->getDisplayName(),
        'action' => 'retry-class',
        'taskClass' => $class,
        'taskIDs' => $retried,
        'refused' => $refused,
        'requestID' => $request_id,
        'outcome' => $refused ? 'partly refused' : 'done',
      ));

    $dialog = $this->newDialog()
      ->setTitle(pht('Retried %s Tasks', phutil_count($retried)))
      ->appendParagraph(
        pht(
          '%s task(s) of class %s are back in the queue.',
          phutil_count($retried),
          $class))
      ->addCancelButton($done_uri, pht('Done'));
    if ($refused) {
      $items = array();
      foreach ($refused as $id => $why) {
        $items[] = pht('Task %d: %s', $id, $why);
      }
      $dialog->setErrors($items);
    }
    return $dialog;
  }

}
