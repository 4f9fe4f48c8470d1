<?php

/**
 * gorge's local PHP executor: a long-lived PHP process that loads Phorge once,
 * like a taskmaster, and runs one queued task after another for gorge-worker.
 *
 *   php gorge-executor.php [--check] <phorge-root>
 *
 * gorge-worker starts and supervises a pool of these. The wire is framed
 * JSON on two extra file descriptors, so that whatever a task prints on
 * stdout or stderr can never be taken for an answer:
 *
 *   fd 3 (read):  one request per line,
 *                 {"id":N,"taskID":ID,"taskClass":"...","data":"...",
 *                  "task":{...the leased row's fields...}}
 *   fd 4 (write): one line first, {"type":"ready","pid":...} once Phorge is
 *                 loaded (or {"type":"fatal","error":"..."} before exiting
 *                 with status 1); then one answer per request, in order,
 *                 {"id":N,"answer":{...as worker.execute answers, with
 *                 "followups"...},"memory":bytes}.
 *
 * The process exits when fd 3 is closed (after the task under way, if any).
 * It never writes the row of the task it runs; gorge-taskqueue records the
 * outcome and queues the follow-ups the answer carries.
 *
 * With --check it loads Phorge and the library, prints one JSON line on
 * stdout and exits: gorge-worker runs this at start-up so that a missing or
 * unloadable Phorge stops it with one line.
 */

$args = array_slice($argv, 1);
$check = false;
if ($args && $args[0] === '--check') {
  $check = true;
  array_shift($args);
}
if (count($args) !== 1) {
  fwrite(STDERR, "usage: php gorge-executor.php [--check] <phorge-root>\n");
  exit(2);
}
$phorge_root = rtrim($args[0], '/');

if ($check) {
  $answer = STDOUT;
} else {
  $requests = @fopen('php://fd/3', 'rb');
  $answer = @fopen('php://fd/4', 'wb');
  if (!$requests || !$answer || @fstat($requests) === false ||
      @fstat($answer) === false) {
    fwrite(
      STDERR,
      "gorge-executor: file descriptors 3 and 4 must be open ".
      "(gorge-worker starts this script)\n");
    exit(2);
  }
}

function gorge_executor_say($stream, array $message) {
  $line = json_encode(
    $message,
    JSON_UNESCAPED_SLASHES | JSON_UNESCAPED_UNICODE |
    JSON_INVALID_UTF8_SUBSTITUTE | JSON_PARTIAL_OUTPUT_ON_ERROR);
  fwrite($stream, $line."\n");
  fflush($stream);
}

function gorge_executor_fatal($stream, $error) {
  gorge_executor_say($stream, array('type' => 'fatal', 'error' => $error));
  exit(1);
}

$init = $phorge_root.'/scripts/init/init-script.php';
if (!is_file($init)) {
  gorge_executor_fatal(
    $answer,
    sprintf('%s is not a Phorge checkout (no scripts/init/init-script.php)', $phorge_root));
}

// A Ctrl-C at the terminal reaches the whole process group; a task must not
// die of it halfway. gorge-worker ends its executors by closing fd 3 (or, at
// a lease deadline, by SIGKILL).
if (function_exists('pcntl_signal')) {
  pcntl_signal(SIGINT, SIG_IGN);
}

// Phorge's init prints its own fatal errors on stdout and exits; catch what
// it throws instead.
try {
  ob_start();
  require_once $init;
  $init_output = ob_get_clean();

  // The site may load this library through load-libraries already; load it
  // from here only when it did not.
  if (!in_array('gorge', PhutilBootloader::getInstance()->getAllLibraries())) {
    phutil_load_library(dirname(__DIR__).'/src');
  }
  if (!class_exists('GorgeWorkerTaskRunner')) {
    gorge_executor_fatal($answer, 'the gorge library did not load');
  }
} catch (Throwable $ex) {
  $output = ob_get_level() ? ob_get_clean() : '';
  gorge_executor_fatal(
    $answer,
    trim(get_class($ex).': '.$ex->getMessage().' '.$output));
}
if (strlen(trim($init_output))) {
  // Phorge printed something while loading (a warning): keep it in the log.
  fwrite(STDERR, $init_output);
}

$ready = array(
  'type' => 'ready',
  'pid' => getmypid(),
  'php' => PHP_VERSION,
  'phorge' => $phorge_root,
);

if ($check) {
  gorge_executor_say($answer, $ready);
  exit(0);
}
gorge_executor_say($answer, $ready);

while (($line = fgets($requests)) !== false) {
  $request = json_decode($line, true);
  if (!is_array($request) || !isset($request['id'])) {
    gorge_executor_fatal($answer, 'unreadable request: '.substr($line, 0, 200));
  }

  // As Phorge's taskmaster does between tasks: nothing cached for one task
  // leaks into the next.
  PhabricatorCaches::destroyRequestCache();

  $task_id = idx($request, 'taskID');
  $fields = idx($request, 'task');
  try {
    $result = id(new GorgeWorkerTaskRunner())
      ->setTaskID($task_id === null ? null : (int)$task_id)
      ->setTaskClass((string)idx($request, 'taskClass', ''))
      ->setRawData(idx($request, 'data'))
      ->setTaskFields(is_array($fields) ? $fields : null)
      ->setReturnFollowups(true)
      ->run();
  } catch (Throwable $ex) {
    // The runner catches what the task throws; this is the runner itself.
    $result = array(
      'result' => GorgeWorkerTaskRunner::RESULT_FAILURE,
      'failureType' => 'transient',
      'failureReason' => get_class($ex).': '.$ex->getMessage(),
    );
  }

  gorge_executor_say(
    $answer,
    array(
      'id' => $request['id'],
      'answer' => $result,
      'memory' => memory_get_usage(true),
    ));

  // Taskmasters close idle database connections while they sleep.
  LiskDAO::closeInactiveConnections(60);
}

exit(0);
