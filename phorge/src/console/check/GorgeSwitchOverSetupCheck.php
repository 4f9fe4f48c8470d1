<?php

/**
 * The parts of the switch-over that live in Phorge's configuration and can
 * drift from the daemons: the gorge mailer in cluster.mailers, and which
 * party delivers webhooks.
 */
final class GorgeSwitchOverSetupCheck extends PhabricatorSetupCheck {

  const MAILER_ISSUE = 'gorge.mailer.not-in-cluster-mailers';
  const MAILER_URI_ISSUE = 'gorge.mailer.uri-mismatch';
  const WEBHOOK_OWNER_ISSUE = 'gorge.webhook.owner';

  public function getDefaultGroup() {
    return self::GROUP_IMPORTANT;
  }

  protected function executeChecks() {
    $daemons = GorgeDaemon::loadConfiguredDaemons();
    if (!$daemons) {
      return;
    }

    if (isset($daemons[GorgeDaemon::MAILER])) {
      $this->checkMailer($daemons[GorgeDaemon::MAILER]);
    }
    if (isset($daemons[GorgeDaemon::WORKER])) {
      $this->checkWebhookOwner(
        $daemons[GorgeDaemon::WORKER],
        isset($daemons[GorgeDaemon::WEBHOOK]));
    }
  }

  private function checkMailer(GorgeDaemon $mailer) {
    $entries = PhabricatorEnv::getEnvConfig('cluster.mailers');
    $gorge = array();
    foreach ((array)$entries as $entry) {
      if (idx($entry, 'type') === GorgeMailAdapter::ADAPTERTYPE) {
        $gorge[] = $entry;
      }
    }

    if (!$gorge) {
      $this->newIssue(self::MAILER_ISSUE)
        ->setShortName(pht('gorge Mailer Missing'))
        ->setName(pht('No gorge Mailer in cluster.mailers'))
        ->setSummary(
          pht(
            'gorge-mailer is configured, but %s has no entry of type "%s": '.
            'mail does not go through it.',
            'cluster.mailers',
            GorgeMailAdapter::ADAPTERTYPE))
        ->setMessage(
          pht(
            'gorge.daemons names gorge-mailer at %s, but no %s entry has the '.
            'type "%s", so Phorge sends mail with its other mailers (or '.
            'none). Add the entry (docs/phorge.md, step 3), or remove the '.
            'mailer from gorge.daemons if mail is not meant to go through '.
            'gorge.',
            $mailer->getDisplayURI(),
            'cluster.mailers',
            GorgeMailAdapter::ADAPTERTYPE))
        ->addPhabricatorConfig('cluster.mailers')
        ->addPhabricatorConfig('gorge.daemons');
      return;
    }

    $want = rtrim($mailer->getDisplayURI(), '/');
    foreach ($gorge as $entry) {
      $uri = rtrim((string)idx((array)idx($entry, 'options'), 'uri'), '/');
      if ($uri === $want) {
        return;
      }
    }

    $this->newIssue(self::MAILER_URI_ISSUE)
      ->setShortName(pht('gorge Mailer URI'))
      ->setName(pht('gorge Mailer Points Elsewhere'))
      ->setSummary(
        pht(
          'No "%s" entry of %s sends to %s, the gorge-mailer of %s.',
          GorgeMailAdapter::ADAPTERTYPE,
          'cluster.mailers',
          $want,
          'gorge.daemons'))
      ->setMessage(
        pht(
          'The console and checks watch gorge-mailer at %s, while mail goes '.
          'to another address. Make the two agree.',
          $want))
      ->addPhabricatorConfig('cluster.mailers')
      ->addPhabricatorConfig('gorge.daemons');
  }

  /**
   * Exactly one party delivers webhook requests: gorge-webhook (then
   * gorge-worker completes HeraldWebhookWorker tasks without delivering),
   * or Phorge's PHP through gorge-worker. A worker that reports its owner
   * in its stats is compared with whether gorge.daemons names gorge-webhook.
   */
  private function checkWebhookOwner(GorgeDaemon $worker, $have_webhook) {
    $stats = $worker->call('GET', '/api/worker/stats', array(), null, null,
      GorgeDaemonHealth::PROBE_TIMEOUT);
    if (!$stats->isOK()) {
      // Unreachable or refused: GorgeDaemonsSetupCheck reports that.
      return;
    }
    $owner = idx((array)$stats->getData(), 'webhookOwner');
    if (!is_string($owner)) {
      // Older workers do not say; nothing to compare.
      return;
    }

    if ($have_webhook && $owner !== 'gorge-webhook') {
      $problem = pht(
        'gorge.daemons names gorge-webhook, but gorge-worker\'s '.
        'GORGE_WORKER_WEBHOOK_OWNER is "%s": webhooks may be delivered '.
        'twice.',
        $owner);
    } else if (!$have_webhook && $owner === 'gorge-webhook') {
      $problem = pht(
        'gorge-worker leaves webhook requests to gorge-webhook, but '.
        'gorge.daemons names no gorge-webhook: if none runs, webhooks are '.
        'never delivered.');
    } else {
      return;
    }

    $this->newIssue(self::WEBHOOK_OWNER_ISSUE)
      ->setShortName(pht('Webhook Owner'))
      ->setName(pht('Webhook Delivery Has No Single Owner'))
      ->setSummary($problem)
      ->setMessage(
        pht(
          '%s Set GORGE_WORKER_WEBHOOK_OWNER to gorge-webhook when '.
          'gorge-webhook runs, to phorge when it does not (docs/phorge.md).',
          $problem))
      ->addPhabricatorConfig('gorge.daemons');
  }

}
