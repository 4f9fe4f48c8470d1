<?php

/**
 * One issue per configured gorge daemon that is unreachable, not ready, or
 * speaks an API this library does not know; and, while gorge runs Phorge's
 * task queue, gorge's own word on the queue in place of Phorge's
 * "Daemons Are Not Running".
 *
 * Phorge's check looks for a running PhabricatorTaskmasterDaemon in its
 * daemon log. After the switch-over (phd.taskmasters = 0, gorge-worker named
 * in gorge.daemons) there is none, and the check's advice (start phd) would
 * be wrong; this check marks that issue ignored and raises
 * "gorge-worker Is Not Running Tasks" instead when gorge-worker is down, not
 * ready, or cannot reach gorge-taskqueue. Without gorge-worker in
 * gorge.daemons, or with taskmasters configured again (rollback), Phorge's
 * issue is left as it is.
 */
final class GorgeDaemonsSetupCheck extends PhabricatorSetupCheck {

  const STOCK_DAEMONS_ISSUE = 'daemons.not-running';
  const WORKER_ISSUE = 'gorge.worker.not-running';
  const CONDUIT_ISSUE = 'gorge.worker.conduit';

  public function getDefaultGroup() {
    return self::GROUP_IMPORTANT;
  }

  public function getExecutionOrder() {
    // After Phorge's own checks (1000), so that the stock daemons issue has
    // been raised by the time this check looks at it.
    return 1100;
  }

  public static function getDaemonIssueKey($name) {
    return 'gorge.daemon.'.$name;
  }

  public static function getVersionIssueKey($name) {
    return 'gorge.daemon.'.$name.'.version';
  }

  protected function executeChecks() {
    $daemons = GorgeDaemon::loadConfiguredDaemons();
    if (!$daemons) {
      return;
    }

    $runs_queue = self::gorgeRunsTheQueue();
    $health = GorgeDaemonHealth::probeAll($daemons);
    foreach ($health as $name => $item) {
      if ($name === GorgeDaemon::WORKER) {
        $this->checkWorker($item, $runs_queue);
      } else {
        $this->checkReadiness($item);
      }
      $this->checkVersion($item);
    }

    if (isset($daemons[GorgeDaemon::WORKER]) && $runs_queue) {
      $this->ignoreStockDaemonsIssue();
    }
  }

  public static function gorgeRunsTheQueue() {
    return ((int)PhabricatorEnv::getEnvConfig('phd.taskmasters') === 0);
  }

  private function checkReadiness(GorgeDaemonHealth $item) {
    $problem = $item->getReadinessProblem();
    if ($problem === null) {
      return;
    }

    $daemon = $item->getDaemon();
    $label = $daemon->getDisplayName();
    if ($item->isReachable()) {
      $name = pht('%s Is Not Ready', $label);
    } else {
      $name = pht('%s Is Unreachable', $label);
    }

    $this->newIssue(self::getDaemonIssueKey($daemon->getName()))
      ->setShortName($label)
      ->setName($name)
      ->setSummary(pht('%s at %s: %s', $label, $daemon->getDisplayURI(), $problem))
      ->setMessage(
        pht(
          '%s (configured in %s) answered its readiness probe %s with: %s. '.
          'Until it is ready, the work it does for this install waits. See '.
          'the gorge console at %s and the daemon\'s log.',
          $label,
          'gorge.daemons',
          '/readyz',
          $problem,
          '/gorge/'))
      ->addPhabricatorConfig('gorge.daemons');
  }

  private function checkWorker(GorgeDaemonHealth $item, $runs_queue) {
    $problem = $item->getReadinessProblem();
    if ($problem === null) {
      return;
    }

    $daemon = $item->getDaemon();
    $reason = (string)$item->getReadinessReason();

    if (!strncmp($reason, 'conduit:', 8)) {
      // The bot's token, its administrator flag, or this library missing
      // from the web server: PHP tasks wait until the probe passes.
      $this->newIssue(self::CONDUIT_ISSUE)
        ->setShortName(pht('gorge-worker Conduit'))
        ->setName(pht('gorge-worker Cannot Call worker.execute'))
        ->setSummary(
          pht('gorge-worker\'s bot cannot run PHP tasks: %s', $reason))
        ->setMessage(
          pht(
            'gorge-worker runs PHP tasks through the Conduit method %s with '.
            'its bot\'s API token, and its probe of that method failed: %s. '.
            '%s means the bot is not an administrator, %s a wrong token, %s '.
            'that the web server has not loaded the gorge library. Tasks of '.
            'classes gorge-worker hands to PHP wait until the probe passes.',
            'worker.execute',
            $reason,
            'ERR-NOT-ADMIN',
            'ERR-INVALID-AUTH',
            'ERR-CONDUIT-CALL'));
      return;
    }

    if (!$runs_queue) {
      // Phorge's taskmasters still run (before the hand-over, or after
      // switching back): a worker that is down stops no task.
      $this->checkReadiness($item);
      return;
    }

    if ($item->isReachable()) {
      $what = pht('gorge-worker is not ready: %s', $problem);
    } else {
      $what = pht(
        'gorge-worker at %s: %s',
        $daemon->getDisplayURI(),
        $problem);
    }

    $this->newIssue(self::WORKER_ISSUE)
      ->setShortName(pht('Tasks Not Running'))
      ->setName(pht('gorge-worker Is Not Running Tasks'))
      ->setSummary(
        pht(
          'Background tasks wait: %s.',
          $what))
      ->setMessage(
        pht(
          'This install\'s task queue is run by gorge (%s is 0), and %s. '.
          'Until gorge-worker leases tasks from gorge-taskqueue again, mail '.
          'is not sent, search indexes are not updated and other background '.
          'work waits in the queue; nothing is lost. Start or fix '.
          'gorge-worker (and gorge-taskqueue if its reason names the queue). '.
          'The gorge console at %s shows both.',
          'phd.taskmasters',
          $what,
          '/gorge/'))
      ->addCommand(
        hsprintf('<samp>$</samp><kbd>systemctl start gorge-worker</kbd>'));
  }

  private function checkVersion(GorgeDaemonHealth $item) {
    $problem = $item->getVersionProblem();
    if ($problem === null) {
      return;
    }

    $daemon = $item->getDaemon();
    $label = $daemon->getDisplayName();
    $this->newIssue(self::getVersionIssueKey($daemon->getName()))
      ->setShortName(pht('%s Version', $label))
      ->setName(pht('Cannot Confirm %s Version', $label))
      ->setSummary(pht('%s: %s.', $label, $problem))
      ->setMessage(
        pht(
          'The gorge console and checks read %s\'s API, and %s. Install '.
          'the gorge release this library came with, or fix the token.',
          $label,
          $problem))
      ->addPhabricatorConfig('gorge.daemons');
  }

  /**
   * Mark Phorge's "Daemons Are Not Running" ignored: this check speaks for
   * the queue instead. Setup checks are loaded once per process through
   * PhutilClassMapQuery, so the stock check's instance, which ran just
   * before this one, holds the issue; if it cannot be found, the stock issue
   * stays (the safe side).
   */
  private function ignoreStockDaemonsIssue() {
    foreach (self::loadAllChecks() as $check) {
      if (!($check instanceof PhabricatorDaemonsSetupCheck)) {
        continue;
      }
      $issue = idx((array)$check->getIssues(), self::STOCK_DAEMONS_ISSUE);
      if ($issue) {
        $issue->setIsIgnored(true);
      }
    }
  }

}
