<?php

final class GorgeConsoleOverviewController extends GorgeConsoleController {

  public function handleRequest(AphrontRequest $request) {
    $daemons = GorgeDaemon::loadConfiguredDaemons();

    $content = array();
    if (!$daemons) {
      $content[] = $this->newNotice(
        pht('No gorge Daemons Configured'),
        pht(
          'Set %s with bin/config on this host (docs/phorge.md) to see the '.
          'daemons here.',
          phutil_tag('tt', array(), 'gorge.daemons')));
    }

    $health = GorgeDaemonHealth::probeAll($daemons);
    $content[] = $this->buildDaemonsBox($health);
    $taskqueue = idx($daemons, GorgeDaemon::TASKQUEUE);
    if ($taskqueue) {
      $content[] = $this->buildQueueAgeBox($taskqueue);
    }
    $content[] = $this->buildQueueBox();

    $webhook = idx($daemons, GorgeDaemon::WEBHOOK);
    if ($webhook) {
      $content[] = $this->buildWebhookBox($webhook);
    }

    $content[] = id(new GorgeConsoleMailController())
      ->setRequest($request)
      ->buildMailerSummaryBox(idx($daemons, GorgeDaemon::MAILER));

    return $this->newConsolePage('', pht('Overview'), $content);
  }

  private function buildDaemonsBox(array $health) {
    $rows = array();
    foreach ($health as $name => $item) {
      $daemon = $item->getDaemon();
      if ($item->isReady()) {
        $state = id(new PHUIStatusItemView())
          ->setIcon(PHUIStatusItemView::ICON_ACCEPT, 'green')
          ->setTarget(pht('Ready'));
      } else {
        $state = id(new PHUIStatusItemView())
          ->setIcon(PHUIStatusItemView::ICON_WARNING, 'red')
          ->setTarget(pht('Not ready'))
          ->setNote($item->getReadinessProblem());
      }
      $uptime = $item->getUptime();
      $rows[] = array(
        $daemon->getDisplayName(),
        $daemon->getDisplayURI(),
        id(new PHUIStatusListView())->addItem($state),
        $item->getRelease(),
        $item->getVersion(),
        ($uptime === null)
          ? phutil_tag('em', array(), pht('not reported'))
          : phutil_format_relative_time($uptime),
      );
    }

    $table = id(new AphrontTableView($rows))
      ->setNoDataString(pht('No daemon is configured in gorge.daemons.'))
      ->setHeaders(
        array(
          pht('Daemon'),
          pht('Address'),
          pht('Health'),
          pht('Release'),
          pht('API Version'),
          pht('Uptime'),
        ))
      ->setColumnClasses(array('pri', '', 'wide wrap', '', '', ''));

    return $this->newBox(pht('Daemons'), $table);
  }

  /**
   * How long the oldest waiting task of each class and priority band has
   * waited, as gorge-taskqueue reads it (GET /api/queue/stats, on any of
   * its backends; docs/taskqueue.md, "Queue age").
   */
  private function buildQueueAgeBox(GorgeDaemon $taskqueue) {
    $answer = $taskqueue->call('GET', '/api/queue/stats');
    if (!$answer->isOK()) {
      return $this->newDaemonFailure($taskqueue, $answer);
    }
    $data = (array)$answer->getData();

    $rows = array();
    foreach ((array)idx($data, 'oldestWaiting') as $oldest) {
      $oldest = (array)$oldest;
      $rows[] = array(
        idx($oldest, 'taskClass'),
        idx($oldest, 'priorityBand'),
        self::formatSeconds(idx($oldest, 'ageSeconds')),
      );
    }

    $table = id(new AphrontTableView($rows))
      ->setNoDataString(pht('No task is waiting.'))
      ->setHeaders(
        array(
          pht('Class'),
          pht('Priority Band'),
          pht('Oldest Waited'),
        ))
      ->setColumnClasses(array('wide pri', '', ''));

    $waiting = (int)idx($data, 'activeCount') - (int)idx($data, 'leasedCount');
    return $this->newBox(
      pht(
        'Queue Age (%s active, %s waiting, %s failing)',
        new PhutilNumber((int)idx($data, 'activeCount')),
        new PhutilNumber(max(0, $waiting)),
        new PhutilNumber((int)idx($data, 'failedCount'))),
      $table);
  }

  /**
   * Phorge's own worker tables, which gorge-taskqueue serves: per class and
   * priority, what waits and since when, what is leased, what is delayed.
   *
   * "Waiting" is what gorge_taskqueue_oldest_waiting_seconds means
   * (docs/taskqueue.md, "Queue age"): a lease call could hand the task out
   * now, because it was never leased (no owner, no expiry) or its lease,
   * yield, delay or retry wait ran out (leaseExpires < now). A task delayed
   * into the future is not waiting yet. A never-leased task has waited since
   * it was created, one whose leaseExpires passed since that time, but never
   * from before it was created: Phorge's retry (unarchive) sets
   * leaseExpires to 0.
   */
  public static function loadQueueSummary() {
    $task_table = new PhabricatorWorkerActiveTask();
    $conn = $task_table->establishConnection('r');
    $now = PhabricatorTime::getNow();
    $waiting = qsprintf(
      $conn,
      '((leaseOwner IS NULL AND leaseExpires IS NULL) OR leaseExpires < %d)',
      $now);
    return queryfx_all(
      $conn,
      'SELECT taskClass, priority,
          SUM(%Q) waiting,
          MIN(IF(%Q, GREATEST(dateCreated, COALESCE(leaseExpires, 0)), NULL))
            oldestWaiting,
          SUM(leaseOwner IS NOT NULL AND leaseExpires >= %d) leased,
          SUM(leaseOwner IS NULL AND leaseExpires >= %d) `delayed`,
          COUNT(*) active,
          SUM(failureCount > 0) failing
        FROM %T
        GROUP BY taskClass, priority
        ORDER BY priority, taskClass',
      $waiting,
      $waiting,
      $now,
      $now,
      $task_table->getTableName());
  }

  private function buildQueueBox() {
    $rows = array();
    foreach (self::loadQueueSummary() as $row) {
      $rows[] = array(
        $row['taskClass'],
        self::getPriorityBand($row['priority']),
        number_format((int)$row['waiting']),
        $this->formatAge($row['oldestWaiting']),
        number_format((int)$row['leased']),
        number_format((int)$row['delayed']),
        number_format((int)$row['failing']),
      );
    }

    $table = id(new AphrontTableView($rows))
      ->setNoDataString(pht('The task queue is empty.'))
      ->setHeaders(
        array(
          pht('Class'),
          pht('Priority'),
          pht('Waiting'),
          pht('Oldest Waiting'),
          pht('Leased'),
          pht('Delayed'),
          pht('Failing'),
        ))
      ->setColumnClasses(array('wide pri', '', 'n', '', 'n', 'n', 'n'));

    return $this->newBox(pht('Task Queue'), $table);
  }

  private function buildWebhookBox(GorgeDaemon $webhook) {
    $answer = $webhook->call('GET', '/api/webhook/hooks/state');
    if (!$answer->isOK()) {
      return $this->newDaemonFailure($webhook, $answer);
    }
    return GorgeConsoleWebhookListController::buildHookStateBox(
      $this,
      $answer->getData());
  }

}
