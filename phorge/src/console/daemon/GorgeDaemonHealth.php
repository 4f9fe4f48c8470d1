<?php

/**
 * The health of the configured daemons, read in parallel: each daemon's
 * /readyz, and its /api/<name>/version (the gorge release, the version of
 * its API and its uptime). gorge-worker's stats come along for its webhook
 * owner.
 */
final class GorgeDaemonHealth extends Phobject {

  // A setup check runs inside a page view: a daemon that does not answer
  // within this many seconds counts as unreachable.
  const PROBE_TIMEOUT = 3;

  private $daemon;
  private $ready;
  private $version;
  private $stats;

  public function getDaemon() {
    return $this->daemon;
  }

  /**
   * @param map<string, GorgeDaemon> $daemons
   * @return map<string, GorgeDaemonHealth>
   */
  public static function probeAll(array $daemons) {
    $futures = array();
    foreach ($daemons as $name => $daemon) {
      $futures[$name.'/ready'] = $daemon->newFuture(
        'GET', '/readyz', array(), null, null, self::PROBE_TIMEOUT);
      $futures[$name.'/version'] = $daemon->newFuture(
        'GET',
        '/api/'.self::getAPIName($name).'/version',
        array(),
        null,
        null,
        self::PROBE_TIMEOUT);
      if ($name === GorgeDaemon::WORKER) {
        $futures[$name.'/stats'] = $daemon->newFuture(
          'GET', '/api/worker/stats', array(), null, null, self::PROBE_TIMEOUT);
      }
    }

    $answers = array();
    foreach (new FutureIterator($futures) as $key => $future) {
      $answers[$key] = GorgeDaemonAnswer::newFromFuture($future);
    }

    $health = array();
    foreach ($daemons as $name => $daemon) {
      $item = new self();
      $item->daemon = $daemon;
      $item->ready = $answers[$name.'/ready'];
      $item->version = $answers[$name.'/version'];
      $item->stats = idx($answers, $name.'/stats');
      $health[$name] = $item;
    }
    return $health;
  }

  private static function getAPIName($name) {
    // The routes are /api/queue/, /api/worker/, /api/webhook/, /api/mailer/.
    return ($name === GorgeDaemon::TASKQUEUE) ? 'queue' : $name;
  }

  public function isReachable() {
    return $this->ready->isReachable();
  }

  public function isReady() {
    return $this->ready->isReachable() &&
      ($this->ready->getHTTPStatus() === 200);
  }

  /**
   * Why /readyz is not 200: the daemon's own reason, or why it did not
   * answer.
   */
  public function getReadinessProblem() {
    if ($this->isReady()) {
      return null;
    }
    return $this->ready->describeFailure();
  }

  public function getReadinessReason() {
    $reason = idx((array)$this->ready->getBody(), 'reason');
    return is_string($reason) ? $reason : null;
  }

  /**
   * The daemon's /version answer, or null when it could not be read (the
   * token was refused, or the daemon is down).
   */
  private function getVersionData() {
    if (!$this->version->isOK()) {
      return null;
    }
    $data = $this->version->getData();
    return is_array($data) ? $data : null;
  }

  /**
   * The daemon's API version, or null when it could not be read.
   */
  public function getVersion() {
    $version = idx((array)$this->getVersionData(), 'apiVersion');
    return is_string($version) ? $version : null;
  }

  /**
   * The gorge release the daemon runs, or null when it could not be read.
   */
  public function getRelease() {
    $release = idx((array)$this->getVersionData(), 'version');
    return is_string($release) ? $release : null;
  }

  public function getVersionProblem() {
    if (!$this->isReachable()) {
      return null;
    }
    if (!$this->version->isOK()) {
      if ($this->version->getHTTPStatus() === 401) {
        return pht(
          'the daemon refused the service token in gorge.daemons.%s.token',
          $this->daemon->getName());
      }
      return pht(
        'its version route did not answer (%s)',
        $this->version->describeFailure());
    }
    $version = $this->getVersion();
    if ($version === null) {
      return pht('its version route names no API version');
    }
    if (!self::isCompatibleVersion($version)) {
      return pht(
        'its API version is %s; this library needs %s or a later %s.x',
        $version,
        GorgeDaemon::REQUIRED_API_VERSION,
        head(explode('.', GorgeDaemon::REQUIRED_API_VERSION)));
    }
    return null;
  }

  public static function isCompatibleVersion($version) {
    $required = explode('.', GorgeDaemon::REQUIRED_API_VERSION);
    $actual = explode('.', $version);
    if (count($actual) < 2 || !ctype_digit($actual[0])) {
      return false;
    }
    if ((int)$actual[0] !== (int)$required[0]) {
      return false;
    }
    return version_compare($version, GorgeDaemon::REQUIRED_API_VERSION, '>=');
  }

  /**
   * gorge-worker's /api/worker/stats, or null.
   */
  public function getWorkerStats() {
    if (!$this->stats || !$this->stats->isOK()) {
      return null;
    }
    $data = $this->stats->getData();
    return is_array($data) ? $data : null;
  }

  /**
   * Seconds since the daemon started, as it says, else null.
   */
  public function getUptime() {
    $uptime = idx((array)$this->getVersionData(), 'uptimeSeconds');
    return is_int($uptime) ? max(0, $uptime) : null;
  }

}
