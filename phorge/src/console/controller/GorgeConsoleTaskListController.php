<?php

final class GorgeConsoleTaskListController extends GorgeConsoleController {

  const LIST_LIMIT = 50;

  public function handleRequest(AphrontRequest $request) {
    $failing = $this->loadFailingTasks();
    $queue = GorgeDaemon::loadDaemon(GorgeDaemon::TASKQUEUE);
    $dead = null;
    $dead_error = null;
    if ($queue) {
      $dead = $queue->call(
        'GET',
        '/api/queue/archived',
        array('result' => 'failure', 'limit' => self::LIST_LIMIT));
      if (!$dead->isOK()) {
        $dead_error = $this->newDaemonFailure($queue, $dead);
        $dead = null;
      } else {
        $dead = (array)$dead->getData();
      }
    }
    $ids = mpull($failing, 'getID');
    foreach ((array)$dead as $task) {
      $ids[] = (int)idx($task, 'id');
    }
    $errors = $this->loadLastErrors($queue, $ids);

    $content = array();
    $content[] = $this->buildClassBox();
    $content[] = $this->buildActiveBox(
      pht('Failing Tasks'),
      pht('No active task has failed.'),
      $failing,
      $errors);
    $content[] = $this->buildActiveBox(
      pht('Leased Tasks'),
      pht('No task is leased.'),
      $this->loadLeasedTasks());
    $content[] = $this->buildActiveBox(
      pht('Next in Queue'),
      pht('No task is waiting.'),
      $this->loadWaitingTasks());

    if (!$queue) {
      $content[] = $this->newNotConfigured(GorgeDaemon::TASKQUEUE);
    } else if ($dead_error) {
      $content[] = $dead_error;
    } else {
      $content[] = $this->buildDeadBox($dead, $errors);
    }

    $content[] = $this->newNotice(
      pht('Where the Errors Are'),
      pht(
        'Phorge\'s task tables keep a failure count and time, not the error '.
        'text. The last error shown here is what gorge-worker reported to '.
        'gorge-taskqueue, which keeps it in memory for a week (not across '.
        'its restarts); gorge-worker\'s log has every failure with the '.
        'task\'s id (WORKER_TASK_OUTCOME task_id=...).'),
      PHUIInfoView::SEVERITY_NOTICE);

    return $this->newConsolePage('tasks', pht('Tasks'), $content);
  }

  /**
   * The last error gorge-taskqueue keeps for each of these tasks, by id
   * (GET /api/queue/failures); none when the queue cannot say.
   */
  private function loadLastErrors($queue, array $ids) {
    $ids = array_unique(array_filter(array_map('intval', $ids)));
    if (!$queue || !$ids) {
      return array();
    }
    $answer = $queue->call(
      'GET',
      '/api/queue/failures',
      array(
        'taskIDs' => implode(',', $ids),
        'limit' => count($ids),
      ));
    if (!$answer->isOK()) {
      return array();
    }
    $errors = array();
    foreach ((array)$answer->getData() as $note) {
      $errors[(int)idx($note, 'taskID')] = $note;
    }
    return $errors;
  }

  private function formatLastError(array $errors, $id) {
    $note = idx($errors, (int)$id);
    if (!$note) {
      return phutil_tag('em', array(), pht('Not known'));
    }
    $message = (string)idx($note, 'message');
    if (!strlen($message)) {
      $message = pht('(the worker gave no message)');
    }
    return phutil_tag(
      'span',
      array('data-gorge-last-error' => (int)$id),
      id(new PhutilUTF8StringTruncator())
        ->setMaximumGlyphs(300)
        ->truncateString($message));
  }

  private function buildClassBox() {
    $rows = array();
    foreach (GorgeConsoleOverviewController::loadQueueSummary() as $row) {
      $rows[] = array(
        $row['taskClass'],
        self::getPriorityBand($row['priority']),
        number_format((int)$row['waiting']),
        number_format((int)$row['leased']),
        number_format((int)$row['delayed']),
        number_format((int)$row['failing']),
        phutil_tag(
          'a',
          array(
            'href' => $this->getFilterURI($row['taskClass']),
            'class' => 'button button-grey small',
            'data-gorge-action' => 'filter-'.$row['taskClass'],
          ),
          pht('Act on Class')),
      );
    }
    $table = id(new AphrontTableView($rows))
      ->setNoDataString(pht('The task queue is empty.'))
      ->setHeaders(
        array(
          pht('Class'),
          pht('Priority'),
          pht('Waiting'),
          pht('Leased'),
          pht('Delayed'),
          pht('Failing'),
          pht('Actions'),
        ))
      ->setColumnClasses(array('wide pri', '', 'n', 'n', 'n', 'n', 'action'));
    return $this->newBoxWithAction(
      pht('Active Tasks by Class'),
      $table,
      pht('Act by Filter'),
      $this->getFilterURI(null),
      'fa-filter');
  }

  /**
   * Cancel, free or reprioritise by filter (GorgeConsoleTaskFilterController),
   * with the class chosen already when one is given.
   */
  private function getFilterURI($class) {
    $uri = new PhutilURI($this->getApplicationURI('tasks/filter/'));
    if ($class !== null) {
      $uri->replaceQueryParam('taskClass', $class);
    }
    return (string)$uri;
  }

  private function loadFailingTasks() {
    // key_failuretime: every failure sets failureTime.
    return id(new PhabricatorWorkerActiveTask())->loadAllWhere(
      'failureTime IS NOT NULL AND failureCount > 0
        ORDER BY failureTime DESC LIMIT %d',
      self::LIST_LIMIT);
  }

  private function loadLeasedTasks() {
    return id(new PhabricatorWorkerActiveTask())->loadAllWhere(
      'leaseOwner IS NOT NULL AND leaseExpires >= %d
        ORDER BY leaseExpires LIMIT %d',
      PhabricatorTime::getNow(),
      self::LIST_LIMIT);
  }

  private function loadWaitingTasks() {
    // key_owner (leaseOwner, priority, id) reads these in lease order.
    return id(new PhabricatorWorkerActiveTask())->loadAllWhere(
      'leaseOwner IS NULL ORDER BY priority, id LIMIT %d',
      self::LIST_LIMIT);
  }

  private function buildActiveBox(
    $title,
    $empty,
    array $tasks,
    ?array $errors = null) {
    $now = PhabricatorTime::getNow();
    $rows = array();
    foreach ($tasks as $task) {
      $leased = ($task->getLeaseOwner() !== null &&
        $task->getLeaseExpires() >= $now);
      $actions = array();
      if ($leased) {
        $actions[] = $this->newActionButton('free', $task->getID(), pht('Free'));
      }
      $actions[] = $this->newActionButton(
        'priority', $task->getID(), pht('Priority'));
      $actions[] = $this->newActionButton(
        'cancel', $task->getID(), pht('Cancel'));

      $rows[] = array(
        phutil_tag(
          'a',
          array('href' => '/daemon/task/'.$task->getID().'/'),
          $task->getID()),
        $task->getTaskClass(),
        self::getPriorityBand($task->getPriority()),
        number_format((int)$task->getFailureCount()),
        $this->formatDate($task->getFailureTime()),
        $errors === null ? null : $this->formatLastError($errors, $task->getID()),
        $leased
          ? pht(
            '%s until %s',
            $task->getLeaseOwner(),
            $this->formatDate($task->getLeaseExpires()))
          : null,
        phutil_implode_html(' ', $actions),
      );
    }

    $table = id(new AphrontTableView($rows))
      ->setNoDataString($empty)
      ->setHeaders(
        array(
          pht('ID'),
          pht('Class'),
          pht('Priority'),
          pht('Failures'),
          pht('Last Failure'),
          pht('Last Error'),
          pht('Lease'),
          pht('Actions'),
        ))
      ->setColumnClasses(array('n', 'pri', '', 'n', '', 'wide', '', 'action'))
      ->setColumnVisibility(array(true, true, true, true, true, $errors !== null));

    return $this->newBox($title, $table);
  }

  private function buildDeadBox(array $tasks, array $errors) {
    $rows = array();
    foreach ($tasks as $task) {
      $id = (int)idx($task, 'id');
      $rows[] = array(
        phutil_tag('a', array('href' => '/daemon/task/'.$id.'/'), $id),
        idx($task, 'taskClass'),
        number_format((int)idx($task, 'failureCount')),
        $this->formatDate(idx($task, 'archivedEpoch')),
        $this->formatLastError($errors, $id),
        phutil_implode_html(
          ' ',
          array(
            $this->newActionButton('retry', $id, pht('Retry')),
            $this->newActionButton('requeue', $id, pht('Requeue')),
          )),
      );
    }

    $table = id(new AphrontTableView($rows))
      ->setNoDataString(pht('No task has failed permanently.'))
      ->setHeaders(
        array(
          pht('ID'),
          pht('Class'),
          pht('Failures'),
          pht('Archived'),
          pht('Last Error'),
          pht('Actions'),
        ))
      ->setColumnClasses(array('n', 'pri', 'n', '', 'wide', 'action'));

    return $this->newBoxWithAction(
      pht('Dead Tasks (Failed Permanently)'),
      $table,
      pht('Retry by Class'),
      $this->getApplicationURI('tasks/retry-class/'));
  }

  private function newActionButton($verb, $id, $label) {
    return phutil_tag(
      'a',
      array(
        'href' => $this->getApplicationURI('task/'.$verb.'/'.$id.'/'),
        'class' => 'button button-grey small',
        'data-gorge-action' => $verb.'-'.$id,
      ),
      $label);
  }

}
