<?php

/**
 * The gorge console at /gorge/: the daemons that run this install's task
 * queue, webhooks and mail, for administrators only.
 */
final class PhabricatorGorgeApplication extends PhabricatorApplication {

  public function getName() {
    return pht('gorge');
  }

  public function getShortDescription() {
    return pht('Task Queue, Webhooks and Mail Daemons');
  }

  public function getBaseURI() {
    return '/gorge/';
  }

  public function getIcon() {
    return 'fa-cogs';
  }

  public function getApplicationGroup() {
    return self::GROUP_ADMIN;
  }

  public function canUninstall() {
    return false;
  }

  public function getPolicy($capability) {
    // Administrators only, and not editable: the console acts on every
    // task, webhook request and mail of the install.
    if ($capability === PhabricatorPolicyCapability::CAN_VIEW) {
      return PhabricatorPolicies::POLICY_ADMIN;
    }
    return parent::getPolicy($capability);
  }

  public function getRoutes() {
    return array(
      '/gorge/' => array(
        '' => 'GorgeConsoleOverviewController',
        'tasks/' => 'GorgeConsoleTaskListController',
        'tasks/retry-class/' => 'GorgeConsoleTaskRetryClassController',
        'tasks/filter/' => 'GorgeConsoleTaskFilterController',
        'task/(?P<verb>requeue|retry|cancel|free|priority)/(?P<id>[1-9]\d*)/'
          => 'GorgeConsoleTaskActionController',
        'webhooks/' => 'GorgeConsoleWebhookListController',
        'webhooks/retry-since/' => 'GorgeConsoleWebhookRetrySinceController',
        'webhook/retry/(?P<id>[1-9]\d*)/'
          => 'GorgeConsoleWebhookRetryController',
        'mail/' => 'GorgeConsoleMailController',
      ),
    );
  }

}
