<?php

/**
 * An administrator's action in the gorge console (a task requeued,
 * cancelled, freed, retried or reprioritised; a webhook request retried),
 * in the activity log at /people/logs/.
 */
final class GorgeConsoleActionUserLogType
  extends PhabricatorUserLogType {

  const LOGTYPE = 'gorge-console';

  public function getLogTypeName() {
    return pht('gorge Console Action');
  }

}
