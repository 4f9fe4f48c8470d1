<?php

abstract class GorgeConsoleController extends PhabricatorController {

  // Calls one action on many tasks keeps open at once.
  const PARALLEL_CALLS = 8;

  public function shouldRequireAdmin() {
    return true;
  }

  protected function buildNav($selected) {
    $nav = new AphrontSideNavFilterView();
    $nav->setBaseURI(new PhutilURI($this->getApplicationURI()));
    $nav->addLabel(pht('gorge'));
    $nav->addFilter('', pht('Overview'));
    $nav->addFilter('tasks', pht('Tasks'));
    $nav->addFilter('webhooks', pht('Webhooks'));
    $nav->addFilter('mail', pht('Mail'));
    $nav->addLabel(pht('Phorge'));
    $nav->addFilter(
      'daemon-console',
      pht('Daemon Console'),
      '/daemon/');
    $nav->addFilter(
      'setup-issues',
      pht('Setup Issues'),
      '/config/issue/');
    $nav->selectFilter($selected);
    return $nav;
  }

  protected function newConsolePage($selected, $title, array $content) {
    $crumbs = $this->buildApplicationCrumbs()
      ->addTextCrumb($title)
      ->setBorder(true);

    $view = id(new PHUITwoColumnView())
      ->setFooter($content);

    return $this->newPage()
      ->setTitle(array(pht('gorge'), $title))
      ->setCrumbs($crumbs)
      ->setNavigation($this->buildNav($selected))
      ->appendChild($view);
  }

  protected function newBox($title, $table) {
    return id(new PHUIObjectBoxView())
      ->setHeaderText($title)
      ->setBackground(PHUIObjectBoxView::BLUE_PROPERTY)
      ->setTable($table);
  }

  protected function newBoxWithAction($title, $table, $action_label,
    $action_uri, $icon = 'fa-repeat') {
    $button = id(new PHUIButtonView())
      ->setTag('a')
      ->setText($action_label)
      ->setHref($action_uri)
      ->setIcon($icon);
    $header = id(new PHUIHeaderView())
      ->setHeader($title)
      ->addActionLink($button);
    return id(new PHUIObjectBoxView())
      ->setHeader($header)
      ->setBackground(PHUIObjectBoxView::BLUE_PROPERTY)
      ->setTable($table);
  }

  protected function newNotice($title, $message,
    $severity = PHUIInfoView::SEVERITY_WARNING) {
    return id(new PHUIInfoView())
      ->setTitle($title)
      ->setSeverity($severity)
      ->appendChild($message);
  }

  protected function newNotConfigured($name) {
    return $this->newNotice(
      pht('gorge-%s Is Not Configured', $name),
      pht(
        'Name it in %s (its URI and service token) to see it here.',
        phutil_tag('tt', array(), 'gorge.daemons')),
      PHUIInfoView::SEVERITY_NOTICE);
  }

  /**
   * The dialog of an action whose daemon is not named in gorge.daemons.
   */
  protected function newNotConfiguredDialog($name, $action, $done_uri) {
    return $this->newDialog()
      ->setTitle(pht('gorge-%s Is Not Configured', $name))
      ->appendParagraph(pht('Name it in gorge.daemons to %s here.', $action))
      ->addCancelButton($done_uri);
  }

  protected function newDaemonFailure($daemon, GorgeDaemonAnswer $answer) {
    return $this->newNotice(
      pht('%s Did Not Answer', $daemon->getDisplayName()),
      $answer->describeFailure(),
      PHUIInfoView::SEVERITY_ERROR);
  }

  protected function formatAge($epoch) {
    if (!$epoch) {
      return null;
    }
    return phutil_format_relative_time(
      max(0, PhabricatorTime::getNow() - (int)$epoch));
  }

  /**
   * A number of seconds a daemon reports (an age, an uptime), or null.
   */
  public static function formatSeconds($seconds) {
    if (!is_int($seconds)) {
      return null;
    }
    return phutil_format_relative_time(max(0, $seconds));
  }

  protected function formatDate($epoch) {
    if (!$epoch) {
      return null;
    }
    return phabricator_datetime((int)$epoch, $this->getViewer());
  }

  public static function getPriorityBand($priority) {
    $bands = array(
      PhabricatorWorker::PRIORITY_ALERTS => pht('alerts'),
      PhabricatorWorker::PRIORITY_DEFAULT => pht('default'),
      PhabricatorWorker::PRIORITY_COMMIT => pht('commit'),
      PhabricatorWorker::PRIORITY_BULK => pht('bulk'),
      PhabricatorWorker::PRIORITY_INDEX => pht('index'),
      PhabricatorWorker::PRIORITY_IMPORT => pht('import'),
    );
    $name = idx($bands, (int)$priority);
    if ($name === null) {
      return (string)$priority;
    }
    return pht('%d (%s)', $priority, $name);
  }

  /**
   * One call of $path per task, a few at a time, all under one request id
   * (so one search of the daemon's log finds every line the action caused):
   * the ids done, and the daemon's refusal of each other id.
   */
  protected function callEach(
    GorgeDaemon $daemon,
    $path,
    array $bodies_by_id,
    $request_id) {

    $futures = array();
    foreach ($bodies_by_id as $id => $body) {
      $futures[$id] = $daemon
        ->newFuture('POST', $path, array(), $body)
        ->addHeader('X-Request-Id', $request_id);
    }

    $done = array();
    $refused = array();
    $iterator = id(new FutureIterator($futures))->limit(self::PARALLEL_CALLS);
    foreach ($iterator as $id => $future) {
      $answer = GorgeDaemonAnswer::newFromFuture($future);
      if ($answer->isOK()) {
        $done[] = $id;
      } else {
        $refused[$id] = $answer->describeFailure();
      }
    }
    sort($done);
    ksort($refused);
    return array($done, $refused);
  }

  /**
   * Log an action in Phorge's activity log (People > Activity Logs).
   */
  protected function logAction(array $details) {
    $viewer = $this->getViewer();
    $log = PhabricatorUserLog::initializeNewLog(
      $viewer,
      $viewer->getPHID(),
      GorgeConsoleActionUserLogType::LOGTYPE);
    $log->setDetails($details);
    $log->save();
    return $log;
  }

}
