<?php

// Helper run with the PHP CLI against a throwaway Phorge, for the
// real-Phorge tests and bench/phorge.py:
//
//   php phorge_helper.php <phorge root> <command> '<JSON arguments>'
//
// It loads Phorge the way its own scripts do (scripts/init/init-script.php,
// configuration from PHABRICATOR_ENV) and prints one JSON object. Every
// write goes through Phorge's own classes, so rows look as Phorge makes them.

$phorge_root = $argv[1];
$command = $argv[2];
$args = json_decode(isset($argv[3]) ? $argv[3] : '{}', true);

require_once $phorge_root.'/scripts/init/init-script.php';

switch ($command) {
  case 'setup':
    $result = gorge_test_setup($args);
    break;
  case 'webhook':
    $result = gorge_test_webhook($args);
    break;
  case 'mail':
    $result = gorge_test_mail($args);
    break;
  case 'schedule':
    $result = gorge_test_schedule($args);
    break;
  case 'schedule-batch':
    $result = gorge_test_schedule_batch($args);
    break;
  case 'schedule-spaced':
    $result = gorge_test_schedule_spaced($args);
    break;
  case 'maniphest-task':
    $result = gorge_test_maniphest_task($args);
    break;
  case 'hooks':
    $result = gorge_test_hooks($args);
    break;
  case 'webhook-batch':
    $result = gorge_test_webhook_batch($args);
    break;
  case 'web-user':
    $result = gorge_test_web_user($args);
    break;
  case 'setup-issue-keys':
    $result = array(
      'keys' => PhabricatorSetupCheck::getOpenSetupIssueKeysFromDatabase(),
    );
    break;
  case 'validate-option':
    $result = gorge_test_validate_option($args);
    break;
  case 'user-logs':
    $result = gorge_test_user_logs($args);
    break;
  case 'console-queue-summary':
    // The gorge console's Task Queue box, as the library reads it.
    $result = array(
      'rows' => GorgeConsoleOverviewController::loadQueueSummary(),
    );
    break;
  case 'lock-name':
    $result = array(
      'name' => PhabricatorGlobalLock::newLock(
        $args['name'],
        $args['parameters'])->getName(),
    );
    break;
  default:
    fwrite(STDERR, "unknown command: {$command}\n");
    exit(2);
}

echo phutil_json_encode($result)."\n";
exit(0);

// A bot account and its API token: an administrator for gorge-worker's
// token, or not, to see worker.execute refuse it.
function gorge_test_setup(array $args) {
  $username = $args['username'];
  $is_admin = isset($args['admin']) ? (bool)$args['admin'] : true;

  $user = id(new PhabricatorUser())
    ->setUsername($username)
    ->setRealName(pht('gorge worker'))
    ->setIsApproved(1);

  $email = id(new PhabricatorUserEmail())
    ->setAddress($username.'@example.com')
    ->setIsVerified(1);

  id(new PhabricatorUserEditor())
    ->setActor($user)
    ->createNewUser($user, $email);

  $user
    ->setIsSystemAgent(1)
    ->setIsAdmin((int)$is_admin)
    ->save();

  $token = PhabricatorConduitToken::initializeNewToken(
    $user->getPHID(),
    PhabricatorConduitToken::TYPE_STANDARD);
  $token->save();

  return array(
    'userPHID' => $user->getPHID(),
    'token' => $token->getToken(),
  );
}

// A webhook and a global Herald rule that calls it whenever a Maniphest task
// is created.
function gorge_test_webhook(array $args) {
  $viewer = id(new PhabricatorPeopleQuery())
    ->setViewer(PhabricatorUser::getOmnipotentUser())
    ->withUsernames(array($args['author']))
    ->executeOne();

  $hook = HeraldWebhook::initializeNewWebhook($viewer)
    ->setName($args['name'])
    ->setWebhookURI($args['uri'])
    ->setStatus(HeraldWebhook::HOOKSTATUS_ENABLED);
  $hook->save();

  $adapter = new HeraldManiphestTaskAdapter();

  $condition = id(new HeraldCondition())
    ->setFieldName(HeraldNewObjectField::FIELDCONST)
    ->setFieldCondition(HeraldAdapter::CONDITION_IS_TRUE)
    ->setValue(true);

  $action = id(new HeraldActionRecord())
    ->setAction(HeraldCallWebhookAction::ACTIONCONST)
    ->setTarget(array($hook->getPHID()));

  $rule = id(new HeraldRule())
    ->setAuthorPHID($viewer->getPHID())
    ->setMustMatchAll(1)
    ->setContentType($adapter->getAdapterContentType())
    ->setRuleType(HeraldRuleTypeConfig::RULE_TYPE_GLOBAL)
    ->setRepetitionPolicyStringConstant(HeraldRule::REPEAT_EVERY)
    ->attachConditions(array())
    ->attachActions(array());

  $state = id(new HeraldRuleSerializer())->serializeRuleComponents(
    true,
    array($condition),
    array($action),
    HeraldRule::REPEAT_EVERY);

  $xactions = array();
  $xactions[] = id(new HeraldRuleTransaction())
    ->setTransactionType(PhabricatorTransactions::TYPE_CREATE);
  $xactions[] = id(new HeraldRuleTransaction())
    ->setTransactionType(HeraldRuleEditTransaction::TRANSACTIONTYPE)
    ->setNewValue($state);
  $xactions[] = id(new HeraldRuleTransaction())
    ->setTransactionType(HeraldRuleNameTransaction::TRANSACTIONTYPE)
    ->setNewValue($args['name']);

  id(new HeraldRuleEditor())
    ->setActor($viewer)
    ->setContinueOnNoEffect(true)
    ->setContentSource(
      PhabricatorContentSource::newForSource(
        PhabricatorConsoleContentSource::SOURCECONST))
    ->applyTransactions($rule, $xactions);

  return array(
    'hookPHID' => $hook->getPHID(),
    'hmacKey' => $hook->getHmacKey(),
    'rulePHID' => $rule->getPHID(),
  );
}

// A mail queued the normal way: saveAndSend() writes the row and schedules
// the PhabricatorMetaMTAWorker task that sends it.
function gorge_test_mail(array $args) {
  $mail = id(new PhabricatorMetaMTAMail())
    ->addRawTos($args['to'])
    ->setSubject($args['subject'])
    ->setBody($args['body']);
  $mail->saveAndSend();

  return array(
    'mailID' => (int)$mail->getID(),
  );
}

function gorge_test_schedule(array $args) {
  $options = array();
  if (isset($args['priority'])) {
    $options['priority'] = (int)$args['priority'];
  }
  if (isset($args['delayUntil'])) {
    $options['delayUntil'] = (int)$args['delayUntil'];
  }

  $task = PhabricatorWorker::scheduleTask(
    $args['taskClass'],
    $args['data'],
    $options);

  return array(
    'taskID' => (int)$task->getID(),
    'committedAt' => microtime(true),
  );
}

// Many tasks scheduled the normal way, inside one transaction on the worker
// database: a consumer that is already running sees all of them at once, at
// "committedAt".
function gorge_test_schedule_batch(array $args) {
  $tasks = new PhabricatorWorkerActiveTask();
  $first = null;
  $last = null;

  $tasks->openTransaction();
  for ($ii = 0; $ii < $args['count']; $ii++) {
    $task = PhabricatorWorker::scheduleTask($args['taskClass'], $args['data']);
    if ($first === null) {
      $first = (int)$task->getID();
    }
    $last = (int)$task->getID();
  }
  $tasks->saveTransaction();

  return array(
    'firstID' => $first,
    'lastID' => $last,
    'committedAt' => microtime(true),
  );
}

// Single tasks, each scheduled (and committed) after its own pause, for
// pickup latencies: one (taskID, committedAt) per pause in "gapsMs".
function gorge_test_schedule_spaced(array $args) {
  $scheduled = array();
  foreach ($args['gapsMs'] as $gap_ms) {
    usleep((int)($gap_ms * 1000));
    $task = PhabricatorWorker::scheduleTask($args['taskClass'], $args['data']);
    $scheduled[] = array(
      'taskID' => (int)$task->getID(),
      'committedAt' => microtime(true),
    );
  }
  return array('tasks' => $scheduled);
}

function gorge_test_user($username) {
  return id(new PhabricatorPeopleQuery())
    ->setViewer(PhabricatorUser::getOmnipotentUser())
    ->withUsernames(array($username))
    ->executeOne();
}

// A Maniphest task created through its editor, as an edit in the web UI
// would: the object (and transactions) that webhook requests point at.
function gorge_test_maniphest_task(array $args) {
  $viewer = gorge_test_user($args['author']);

  $task = ManiphestTask::initializeNewTask($viewer);
  $xactions = array();
  $xactions[] = id(new ManiphestTransaction())
    ->setTransactionType(ManiphestTaskTitleTransaction::TRANSACTIONTYPE)
    ->setNewValue($args['title']);

  $applied = id(new ManiphestTransactionEditor())
    ->setActor($viewer)
    ->setContinueOnNoEffect(true)
    ->setContentSource(
      PhabricatorContentSource::newForSource(
        PhabricatorConsoleContentSource::SOURCECONST))
    ->applyTransactions($task, $xactions);

  return array(
    'phid' => $task->getPHID(),
    'transactionPHIDs' => array_values(mpull($applied, 'getPHID')),
  );
}

// Enabled webhooks, the n-th calling "<uri>/<n>".
function gorge_test_hooks(array $args) {
  $viewer = gorge_test_user($args['author']);

  $phids = array();
  for ($ii = 0; $ii < $args['count']; $ii++) {
    $hook = HeraldWebhook::initializeNewWebhook($viewer)
      ->setName($args['name'].' '.$ii)
      ->setWebhookURI($args['uri'].'/'.$ii)
      ->setStatus(HeraldWebhook::HOOKSTATUS_ENABLED);
    $hook->save();
    $phids[] = $hook->getPHID();
  }
  return array('hookPHIDs' => $phids);
}

// Webhook requests made the way an edit makes them (the transaction
// editor's queueWebhooks(): a request row, then its HeraldWebhookWorker task
// through queueCall()), round-robin over the hooks. Rows and tasks are
// written in one transaction on each database and committed together, the
// requests first, so a consumer that is already running sees all of them at
// once, at "committedAt". "retryMode" (default "forever"): "never" makes a
// request that fails once end "failed".
function gorge_test_webhook_batch(array $args) {
  $hooks = id(new HeraldWebhookQuery())
    ->setViewer(PhabricatorUser::getOmnipotentUser())
    ->withPHIDs($args['hookPHIDs'])
    ->execute();
  $hooks = array_values(mpull($hooks, null, 'getPHID'));

  $requests = new HeraldWebhookRequest();
  $tasks = new PhabricatorWorkerActiveTask();
  $requests->openTransaction();
  $tasks->openTransaction();
  for ($ii = 0; $ii < $args['count']; $ii++) {
    $hook = $hooks[$ii % count($hooks)];
    $request = HeraldWebhookRequest::initializeNewWebhookRequest($hook)
      ->setObjectPHID($args['objectPHID'])
      ->setTransactionPHIDs($args['transactionPHIDs'])
      ->setTriggerPHIDs(array($hook->getPHID()))
      ->setRetryMode(idx($args, 'retryMode', HeraldWebhookRequest::RETRY_FOREVER))
      ->setIsSilentAction(false)
      ->setIsSecureAction(false)
      ->save();
    $request->queueCall();
  }
  $requests->saveTransaction();
  $tasks->saveTransaction();

  return array(
    'count' => (int)$args['count'],
    'committedAt' => microtime(true),
  );
}

// A person (not a bot: bots cannot hold web sessions), an administrator or
// not, with a web session: "sessionKey" is the value of the phsid cookie.
function gorge_test_web_user(array $args) {
  $username = $args['username'];

  $user = id(new PhabricatorUser())
    ->setUsername($username)
    ->setRealName($username)
    ->setIsApproved(1);

  $email = id(new PhabricatorUserEmail())
    ->setAddress($username.'@example.com')
    ->setIsVerified(1);

  id(new PhabricatorUserEditor())
    ->setActor($user)
    ->createNewUser($user, $email);

  $user
    ->setIsAdmin((int)$args['admin'])
    ->setIsEmailVerified(1)
    ->save();

  $session_key = id(new PhabricatorAuthSessionEngine())->establishSession(
    PhabricatorAuthSession::TYPE_WEB,
    $user->getPHID(),
    $partial = false);

  return array(
    'userPHID' => $user->getPHID(),
    'sessionKey' => $session_key,
  );
}

// The activity log entries of one type, newest first.
function gorge_test_user_logs(array $args) {
  $logs = id(new PhabricatorUserLog())->loadAllWhere(
    'action = %s ORDER BY id DESC',
    $args['action']);
  $result = array();
  foreach ($logs as $log) {
    $result[] = array(
      'actorPHID' => $log->getActorPHID(),
      'details' => $log->getDetails(),
    );
  }
  return array('logs' => $result);
}

// What Phorge's own validation (bin/config set, the repair of a bad stored
// value) says of a value for an option, and whether the option is locked
// and hidden.
function gorge_test_validate_option(array $args) {
  $options = PhabricatorApplicationConfigOptions::loadAllOptions();
  $option = $options[$args['key']];
  $error = null;
  try {
    $option->getGroup()->validateOption($option, $args['value']);
  } catch (PhabricatorConfigValidationException $ex) {
    $error = $ex->getMessage();
  }
  return array(
    'error' => $error,
    'locked' => (bool)$option->getLocked(),
    'hidden' => (bool)$option->getHidden(),
  );
}
