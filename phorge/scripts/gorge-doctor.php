<?php

/**
 * What `gorge doctor` asks of Phorge itself, on a host with Phorge's code:
 *
 *   php gorge-doctor.php <phorge-root> config
 *   php gorge-doctor.php <phorge-root> webhook-canary '{"uri":"http://..."}'
 *
 * It loads Phorge as its own scripts do (with PHABRICATOR_ENV as bin/phd
 * has it), so every value it reports is the effective one Phorge uses:
 * local configuration, the database, an environment file or the default.
 * `bin/config get` shows only the first two. It does not load the gorge
 * library itself: whether Phorge's own `load-libraries` loads it is one of
 * the things asked.
 *
 * It prints one JSON line on stdout ({"error":"..."} and exit 1 when
 * Phorge does not load).
 *
 * config: the settings the switch-over guide sets, the libraries Phorge
 * loaded, the daemons' API version the gorge library needs, and the
 * taskmaster daemons Phorge's daemon log says are running.
 *
 * webhook-canary: points the Herald webhook "gorge doctor canary" (made on
 * first use, administrators only) at the given URI, enables it, and creates
 * one test request for it the way Herald's "New Test Request" does; then
 * answers the request's PHID and the hook's HMAC key, which signs the POST.
 * `gorge doctor` disables the hook again with webhook-canary-off.
 */

$args = array_slice($argv, 1);
if (count($args) < 2) {
  fwrite(
    STDERR,
    "usage: php gorge-doctor.php <phorge-root> config|webhook-canary|".
    "webhook-canary-off [json]\n");
  exit(2);
}
$phorge_root = rtrim($args[0], '/');
$command = $args[1];
$params = isset($args[2]) ? json_decode($args[2], true) : array();
if (!is_array($params)) {
  $params = array();
}

function gorge_doctor_say(array $message, $status = 0) {
  echo json_encode(
    $message,
    JSON_UNESCAPED_SLASHES | JSON_UNESCAPED_UNICODE |
    JSON_INVALID_UTF8_SUBSTITUTE | JSON_PARTIAL_OUTPUT_ON_ERROR)."\n";
  exit($status);
}

$init = $phorge_root.'/scripts/init/init-script.php';
if (!is_file($init)) {
  gorge_doctor_say(
    array(
      'error' => sprintf(
        '%s is not a Phorge checkout (no scripts/init/init-script.php)',
        $phorge_root),
    ),
    1);
}

// Phorge's init prints its own fatal errors on stdout and exits; keep them
// off the answer line, and catch what it throws instead.
$level = ob_get_level();
try {
  ob_start();
  require_once $init;
  while (ob_get_level() > $level) {
    ob_end_clean();
  }
} catch (Throwable $ex) {
  $output = '';
  while (ob_get_level() > $level) {
    $output = ob_get_clean().$output;
  }
  gorge_doctor_say(
    array(
      'error' => trim(get_class($ex).': '.$ex->getMessage().' '.$output),
    ),
    1);
}

const GORGE_DOCTOR_HOOK_NAME = 'gorge doctor canary';

function gorge_doctor_config() {
  $keys = array(
    'load-libraries',
    'storage.default-namespace',
    'phd.taskmasters',
    'cluster.mailers',
    'security.outbound-blacklist',
    'phabricator.silent',
    'phabricator.base-uri',
  );
  $config = array();
  foreach ($keys as $key) {
    $config[$key] = PhabricatorEnv::getEnvConfig($key);
  }
  // Defined by the gorge library, so only readable when it is loaded.
  $config['gorge.daemons'] = PhabricatorEnv::getEnvConfigIfExists(
    'gorge.daemons');

  $running = id(new PhabricatorDaemonLogQuery())
    ->setViewer(PhabricatorUser::getOmnipotentUser())
    ->withStatus(PhabricatorDaemonLogQuery::STATUS_ALIVE)
    ->withDaemonClasses(array('PhabricatorTaskmasterDaemon'))
    ->execute();

  return array(
    'config' => $config,
    'libraries' => array_values(
      PhutilBootloader::getInstance()->getAllLibraries()),
    'workerExecute' => class_exists('GorgeWorkerExecuteConduitAPIMethod'),
    'gorgeMailer' => class_exists('GorgeMailAdapter'),
    'runningTaskmasters' => count($running),
    // The daemons' API version the library needs (its setup check's rule).
    'gorgeApiVersion' => class_exists('GorgeDaemon')
      ? GorgeDaemon::REQUIRED_API_VERSION
      : null,
  );
}

function gorge_doctor_canary_hook() {
  $hooks = id(new HeraldWebhook())->loadAllWhere(
    'name = %s', GORGE_DOCTOR_HOOK_NAME);
  if ($hooks) {
    return head($hooks);
  }
  return HeraldWebhook::initializeNewWebhook(
    PhabricatorUser::getOmnipotentUser())
    ->setName(GORGE_DOCTOR_HOOK_NAME)
    ->setEditPolicy(PhabricatorPolicies::POLICY_ADMIN)
    ->setViewPolicy(PhabricatorPolicies::POLICY_ADMIN);
}

function gorge_doctor_webhook_canary(array $params) {
  $uri = idx($params, 'uri');
  if (!is_string($uri) || !strlen($uri)) {
    throw new Exception('webhook-canary needs {"uri": ...}');
  }
  $hook = gorge_doctor_canary_hook()
    ->setWebhookURI($uri)
    ->setStatus(HeraldWebhook::HOOKSTATUS_ENABLED)
    ->save();

  // As HeraldWebhookTestController: the hook is its own object.
  $request = HeraldWebhookRequest::initializeNewWebhookRequest($hook)
    ->setObjectPHID($hook->getPHID())
    ->setTriggerPHIDs(array($hook->getPHID()))
    ->setIsTestAction(true)
    ->setTransactionPHIDs(array())
    ->save();
  $request->queueCall();

  return array(
    'hookPHID' => $hook->getPHID(),
    'requestPHID' => $request->getPHID(),
    'hmacKey' => $hook->getHmacKey(),
  );
}

function gorge_doctor_webhook_canary_off() {
  $hooks = id(new HeraldWebhook())->loadAllWhere(
    'name = %s', GORGE_DOCTOR_HOOK_NAME);
  foreach ($hooks as $hook) {
    $hook->setStatus(HeraldWebhook::HOOKSTATUS_DISABLED)->save();
  }
  return array('disabled' => count($hooks));
}

try {
  switch ($command) {
    case 'config':
      gorge_doctor_say(gorge_doctor_config());
      break;
    case 'webhook-canary':
      gorge_doctor_say(gorge_doctor_webhook_canary($params));
      break;
    case 'webhook-canary-off':
      gorge_doctor_say(gorge_doctor_webhook_canary_off());
      break;
    default:
      gorge_doctor_say(array('error' => 'unknown command: '.$command), 2);
  }
} catch (Throwable $ex) {
  gorge_doctor_say(
    array('error' => get_class($ex).': '.$ex->getMessage()),
    1);
}
