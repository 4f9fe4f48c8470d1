<?php

// Prints, as JSON, the columns Phorge's HeraldWebhookWorker writes over a
// request in silent mode (its failRequest(), then Lisk's serialization for
// save()), for the request row given as JSON on stdin.
// Usage: php silent_row.php PHORGE_ROOT < row.json

$root = $argv[1];
require_once $root.'/scripts/init/init-setup.php';

$row = phutil_json_decode(file_get_contents('php://stdin'));

$request = new HeraldWebhookRequest();
$request->loadFromArray($row);

// HeraldWebhookWorker::failRequest(), as doWork() calls it when silent.
$request
  ->setStatus(HeraldWebhookRequest::STATUS_FAILED)
  ->setErrorType(HeraldWebhookRequest::ERRORTYPE_HOOK)
  ->setErrorCode(HeraldWebhookRequest::ERROR_SILENT)
  ->setLastRequestResult(HeraldWebhookRequest::RESULT_NONE)
  ->setLastRequestEpoch(0);

// What save() hands to the database: the property values, serialized.
$values = new ReflectionMethod($request, 'getAllLiskPropertyValues');
$values->setAccessible(true);
$data = $values->invoke($request);
$serialize = new ReflectionMethod($request, 'applyLiskDataSerialization');
$serialize->setAccessible(true);
$serialize->invokeArgs($request, array(&$data, false));

echo phutil_json_encode(array(
  'status' => $data['status'],
  'lastRequestResult' => $data['lastRequestResult'],
  'lastRequestEpoch' => (int)$data['lastRequestEpoch'],
  'properties' => $data['properties'],
));
