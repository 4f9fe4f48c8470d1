<?php

// Test helper run with the PHP CLI against a throwaway Phorge:
//
//   php gorge_test.php <phorge root> <command> '<JSON arguments>'
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
  );
}
