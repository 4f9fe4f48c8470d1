<?php

/**
 * One configured gorge daemon (gorge.daemons): where it listens and the
 * token its API wants. Builds the futures the console and the setup checks
 * resolve; the token goes into a request header and nowhere else.
 */
final class GorgeDaemon extends Phobject {

  const TASKQUEUE = 'taskqueue';
  const WORKER = 'worker';
  const WEBHOOK = 'webhook';
  const MAILER = 'mailer';

  // The oldest daemon API (the "info.version" of each daemon's OpenAPI
  // document) this library's console and checks are written against; a
  // daemon whose major version differs, or that is older, is reported.
  const REQUIRED_API_VERSION = '0.1.0';

  private $name;
  private $uri;
  private $token;

  private function __construct($name, $uri, $token) {
    $this->name = $name;
    $this->uri = rtrim($uri, '/');
    $this->token = $token;
  }

  public static function getDaemonNames() {
    return array(
      self::TASKQUEUE,
      self::WORKER,
      self::WEBHOOK,
      self::MAILER,
    );
  }

  public function getName() {
    return $this->name;
  }

  public function getDisplayName() {
    return 'gorge-'.$this->name;
  }

  /**
   * Where the daemon listens, for an administrator's page: scheme, host
   * and port only.
   */
  public function getDisplayURI() {
    return $this->uri;
  }

  /**
   * The configured daemons, in the order of getDaemonNames().
   *
   * @return map<string, GorgeDaemon>
   */
  public static function loadConfiguredDaemons() {
    try {
      return self::newDaemonsFromConfig(
        PhabricatorEnv::getEnvConfig('gorge.daemons'));
    } catch (Exception $ex) {
      // A malformed value is refused by bin/config and repaired to the
      // default by Phorge; nothing configured is the safe reading.
      return array();
    }
  }

  public static function loadDaemon($name) {
    return idx(self::loadConfiguredDaemons(), $name);
  }

  public static function newDaemonsFromConfig($value) {
    if ($value === null) {
      return array();
    }
    if (!is_array($value)) {
      throw new Exception(pht('gorge.daemons must be a JSON object.'));
    }

    $names = self::getDaemonNames();
    $daemons = array();
    foreach ($value as $name => $spec) {
      if (!in_array($name, $names, true)) {
        throw new Exception(
          pht(
            'gorge.daemons: unknown daemon "%s"; expected one of %s.',
            $name,
            implode(', ', $names)));
      }
      if (!is_array($spec)) {
        throw new Exception(
          pht('gorge.daemons.%s must be an object with "uri" and "token".', $name));
      }
      foreach ($spec as $key => $ignored) {
        if ($key !== 'uri' && $key !== 'token') {
          throw new Exception(
            pht(
              'gorge.daemons.%s: unknown key "%s" (only "uri" and "token").',
              $name,
              $key));
        }
      }
      $uri = idx($spec, 'uri');
      if (!is_string($uri) ||
          !preg_match('(^https?://[^/?#\s]+/?$)', $uri)) {
        throw new Exception(
          pht(
            'gorge.daemons.%s.uri must be the daemon\'s base URI, '.
            'http:// or https:// with a host and no path.',
            $name));
      }
      $token = idx($spec, 'token', '');
      if (!is_string($token)) {
        throw new Exception(
          pht('gorge.daemons.%s.token must be a string.', $name));
      }
      $daemons[$name] = new self($name, $uri, $token);
    }

    $ordered = array();
    foreach ($names as $name) {
      if (isset($daemons[$name])) {
        $ordered[$name] = $daemons[$name];
      }
    }
    return $ordered;
  }

  /**
   * A request to the daemon. Under /api/ it carries the service token; with
   * an actor, X-Request-Id names them, and the daemons log that id on every
   * line the request causes, so the daemon's log says who acted.
   */
  public function newFuture(
    $method,
    $path,
    array $query = array(),
    $body = null,
    ?PhabricatorUser $actor = null,
    $timeout = 10) {

    $uri = new PhutilURI($this->uri.$path);
    foreach ($query as $key => $value) {
      $uri->replaceQueryParam($key, $value);
    }

    $future = id(new HTTPSFuture($uri))
      ->setMethod($method)
      ->setTimeout($timeout)
      ->addHeader('Accept', 'application/json');

    if (strncmp($path, '/api/', 5) === 0 && strlen($this->token)) {
      $future->addHeader('X-Service-Token', $this->token);
    }

    if ($body !== null) {
      $future
        ->addHeader('Content-Type', 'application/json')
        ->setData(phutil_json_encode($body));
    }

    if ($actor) {
      $future->addHeader('X-Request-Id', self::newActorRequestID($actor));
    }

    return $future;
  }

  public static function newActorRequestID(PhabricatorUser $actor) {
    return 'phorge:'.$actor->getUsername().':'.
      Filesystem::readRandomCharacters(12);
  }

  public function call(
    $method,
    $path,
    array $query = array(),
    $body = null,
    ?PhabricatorUser $actor = null,
    $timeout = 10) {

    $future = $this->newFuture($method, $path, $query, $body, $actor, $timeout);
    return GorgeDaemonAnswer::newFromFuture($future);
  }

}
