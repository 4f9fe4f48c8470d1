<?php

/**
 * Cancel, free or reprioritise the active tasks a filter selects (a class,
 * and which of its tasks): choose, see how many tasks that is, then confirm.
 *
 * The count is taken from Phorge's own worker_activetask, which
 * gorge-taskqueue serves (its mysql backend), and the dialog carries the ids
 * it counted: confirming acts on those tasks and no others, each through the
 * same operator route as the single-task buttons, so a task enqueued after
 * the count is never touched and one that finished since is reported, not
 * guessed at.
 */
final class GorgeConsoleTaskFilterController
  extends GorgeConsoleController {

  // Tasks one confirmation acts on; the rest wait for the next round.
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
    $verb = $request->getStr('verb');
    if (!isset(self::getVerbNames()[$verb])) {
      $verb = 'cancel';
    }
    $class = (string)$request->getStr('taskClass');
    $state = $request->getStr('state');
    if (!isset(self::getStateNames()[$state])) {
      $state = 'all';
    }
    $priority = $request->getStr('priority');

    $errors = array();
    if ($request->isFormPost() && ($step === 'preview' || $step === 'confirm')) {
      if (!strlen($class)) {
        $errors[] = pht('Choose a task class.');
      }
      if ($verb === 'priority' &&
          !preg_match('/^\d{1,9}$/', (string)$priority)) {
        $errors[] = pht('The priority must be a whole number, 0 or more.');
      }
    }

    if (!$errors && $request->isFormPost() && $step === 'confirm') {
      $ids = array_slice(
        array_unique(
          array_filter(array_map('intval', explode(',', $request->getStr('ids'))))),
        0,
        self::LIMIT);
      return $this->act($queue, $verb, $class, $state, (int)$priority, $ids,
        $done_uri);
    }

    if (!$errors && $request->isFormPost() && $step === 'preview') {
      return $this->preview($verb, $class, $state, (int)$priority, $done_uri);
    }

    return $this->choose($verb, $class, $state, $priority, $errors, $done_uri);
  }

  public static function getVerbNames() {
    return array(
      'cancel' => pht('Cancel'),
      'free' => pht('Free'),
      'priority' => pht('Set Priority'),
    );
  }

  public static function getStateNames() {
    return array(
      'all' => pht('Every active task'),
      'waiting' => pht('Not leased (waiting or delayed)'),
      'leased' => pht('Leased (running, yielded or lease expired)'),
      'failing' => pht('Failing (failed at least once)'),
    );
  }

  private function choose($verb, $class, $state, $priority, array $errors,
    $done_uri) {

    $classes = array();
    foreach (GorgeConsoleOverviewController::loadQueueSummary() as $row) {
      $name = $row['taskClass'];
      $count = (int)$row['active'];
      $classes[$name] = idx($classes, $name, 0) + $count;
    }
    if (!$classes) {
      return $this->newDialog()
        ->setTitle(pht('Act on Tasks by Filter'))
        ->appendParagraph(pht('The task queue is empty.'))
        ->addCancelButton($done_uri);
    }
    ksort($classes);
    $options = array();
    foreach ($classes as $name => $count) {
      $options[$name] = pht('%s (%s active)', $name, new PhutilNumber($count));
    }

    $form = id(new AphrontFormView())
      ->setViewer($this->getViewer())
      ->appendChild(
        id(new AphrontFormSelectControl())
          ->setLabel(pht('Action'))
          ->setName('verb')
          ->setValue($verb)
          ->setOptions(self::getVerbNames()))
      ->appendChild(
        id(new AphrontFormSelectControl())
          ->setLabel(pht('Class'))
          ->setName('taskClass')
          ->setValue($class)
          ->setOptions($options))
      ->appendChild(
        id(new AphrontFormSelectControl())
          ->setLabel(pht('Tasks'))
          ->setName('state')
          ->setValue($state)
          ->setOptions(self::getStateNames())
          ->setCaption(pht('Free acts on leased tasks only.')))
      ->appendChild(
        id(new AphrontFormTextControl())
          ->setLabel(pht('New Priority'))
          ->setName('priority')
          ->setValue($priority)
          ->setCaption(
            pht(
              'For Set Priority. Lower runs first: %d alerts, %d default, '.
              '%d bulk, %d import.',
              PhabricatorWorker::PRIORITY_ALERTS,
              PhabricatorWorker::PRIORITY_DEFAULT,
              PhabricatorWorker::PRIORITY_BULK,
              PhabricatorWorker::PRIORITY_IMPORT)));

    return $this->newDialog()
      ->setTitle(pht('Act on Tasks by Filter'))
      ->setWidth(AphrontDialogView::WIDTH_FORM)
      ->setErrors($errors)
      ->addHiddenInput('step', 'preview')
      ->appendForm($form)
      ->addSubmitButton(pht('Count Them'))
      ->addCancelButton($done_uri);
  }

  private function preview($verb, $class, $state, $priority, $done_uri) {
    list($ids, $total) = self::loadMatchingTasks($verb, $class, $state);

    $dialog = $this->newDialog()
      ->setTitle(
        pht('%s: %s Tasks', self::getVerbNames()[$verb], $class))
      ->addHiddenInput('step', 'confirm')
      ->addHiddenInput('verb', $verb)
      ->addHiddenInput('taskClass', $class)
      ->addHiddenInput('state', $state)
      ->addHiddenInput('priority', $priority)
      ->addHiddenInput('ids', implode(',', $ids))
      ->addCancelButton($done_uri);

    $which = self::describeState($verb, $state);
    if (!$ids) {
      return $dialog->appendParagraph(
        pht('No active task of class %s is %s.', $class, $which));
    }

    $count = phutil_count($ids);
    switch ($verb) {
      case 'cancel':
        $what = pht(
          'This will cancel %s task(s) of class %s (%s): each is archived as '.
          'cancelled and never runs, whoever holds it.',
          $count, $class, $which);
        $button = pht('Cancel %s Tasks', $count);
        break;
      case 'free':
        $what = pht(
          'This will free %s task(s) of class %s (%s): each lease is broken '.
          'and the task can be leased again at once; a worker still running '.
          'it stops at its next renewal.',
          $count, $class, $which);
        $button = pht('Free %s Tasks', $count);
        break;
      default:
        $what = pht(
          'This will set the priority of %s task(s) of class %s (%s) to %d.',
          $count, $class, $which, $priority);
        $button = pht('Set Priority of %s Tasks', $count);
        break;
    }
    $dialog->appendParagraph($what);
    if ($total > count($ids)) {
      $dialog->appendParagraph(
        pht(
          '%s tasks match; these are the first %s in id order. Run this '.
          'again for the rest.',
          new PhutilNumber($total),
          new PhutilNumber(count($ids))));
    }
    return $dialog->addSubmitButton($button);
  }

  /**
   * The ids (at most LIMIT, in id order) of the active tasks of $class the
   * filter selects, and how many match in all.
   */
  public static function loadMatchingTasks($verb, $class, $state) {
    $table = new PhabricatorWorkerActiveTask();
    $conn = $table->establishConnection('r');

    $where = array();
    $where[] = qsprintf($conn, 'taskClass = %s', $class);
    if ($verb === 'free' || $state === 'leased') {
      // Free breaks a lease: a task nobody holds would only be refused.
      $where[] = qsprintf($conn, 'leaseOwner IS NOT NULL');
    }
    if ($state === 'waiting') {
      $where[] = qsprintf($conn, 'leaseOwner IS NULL');
    }
    if ($state === 'failing') {
      $where[] = qsprintf($conn, 'failureCount > 0');
    }

    // The taskClass key holds the id: both reads are ranges of it.
    $ids = queryfx_all(
      $conn,
      'SELECT id FROM %T WHERE %LA ORDER BY id LIMIT %d',
      $table->getTableName(),
      $where,
      self::LIMIT);
    $total = queryfx_one(
      $conn,
      'SELECT COUNT(*) N FROM %T WHERE %LA',
      $table->getTableName(),
      $where);

    return array(
      array_map('intval', ipull($ids, 'id')),
      (int)$total['N'],
    );
  }

  private static function describeState($verb, $state) {
    if ($verb === 'free' && $state !== 'failing') {
      $state = ($state === 'waiting') ? 'waiting' : 'leased';
    }
    switch ($state) {
      case 'waiting':
        return pht('not leased');
      case 'leased':
        return pht('leased');
      case 'failing':
        return ($verb === 'free')
          ? pht('leased and failing')
          : pht('failing');
      default:
        return pht('any state');
    }
  }

  private function act(GorgeDaemon $queue, $verb, $class, $state, $priority,
    array $ids, $done_uri) {

    $bodies = array();
    foreach ($ids as $id) {
      $body = array('taskID' => $id);
      if ($verb === 'priority') {
        $body['priority'] = $priority;
      }
      $bodies[$id] = $body;
    }
    $request_id = GorgeDaemon::newActorRequestID($this->getViewer());
    list($done, $refused) = $this->callEach(
      $queue, '/api/queue/'.$verb, $bodies, $request_id);

    $this->logAction(
      array(
        'daemon' => $queue->getDisplayName(),
        'action' => $verb.'-by-filter',
        'taskClass' => $class,
        'state' => $state,
        'priority' => ($verb === 'priority') ? $priority : null,
        'taskIDs' => $done,
        'refused' => $refused,
        'requestID' => $request_id,
        'outcome' => $refused ? 'partly refused' : 'done',
      ));

    $count = phutil_count($done);
    switch ($verb) {
      case 'cancel':
        $title = pht('Cancelled %s Tasks', $count);
        break;
      case 'free':
        $title = pht('Freed %s Tasks', $count);
        break;
      default:
        $title = pht('Set the Priority of %s Tasks', $count);
        break;
    }
    $dialog = $this->newDialog()
      ->setTitle($title)
      ->appendParagraph(
        pht(
          '%s task(s) of class %s done; %s refused.',
          $count,
          $class,
          phutil_count($refused)))
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
