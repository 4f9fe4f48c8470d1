<?php

// Prints the name of HeraldWebhookWorker's lock for each hook PHID, as
// Phorge's own PhabricatorGlobalLock derives it.
// Usage: php lock_name.php PHORGE_ROOT NAMESPACE HOOK_PHID...

$root = $argv[1];
require_once $root.'/scripts/init/init-setup.php';

PhabricatorEnv::overrideConfig('storage.default-namespace', $argv[2]);
foreach (array_slice($argv, 3) as $hook_phid) {
  $lock = PhabricatorGlobalLock::newLock('webhook('.$hook_phid.')');
  echo $lock->getName()."\n";
}
