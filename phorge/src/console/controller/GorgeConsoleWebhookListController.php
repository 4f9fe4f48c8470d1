<?php

final class GorgeConsoleWebhookListController extends GorgeConsoleController {

  const RECENT_FAILURES = 50;

  public function handleRequest(AphrontRequest $request) {
    $webhook = GorgeDaemon::loadDaemon(GorgeDaemon::WEBHOOK);
    if (!$webhook) {
      return $this->newConsolePage(
        'webhooks',
        pht('Webhooks'),
        array($this->newNotConfigured(GorgeDaemon::WEBHOOK)));
    }

    $content = array();
    $hooks = array();
    $state = $webhook->call('GET', '/api/webhook/hooks/state');
    if ($state->isOK()) {
      $content[] = self::buildHookStateBox($this, $state->getData());
      foreach ((array)idx((array)$state->getData(), 'hooks') as $hook) {
        $hooks[idx($hook, 'phid')] = $hook;
      }
    } else {
      $content[] = $this->newDaemonFailure($webhook, $state);
    }

    $failures = $webhook->call(
      'GET',
      '/api/webhook/requests',
      array('result' => 'fail', 'limit' => self::RECENT_FAILURES));
    if ($failures->isOK()) {
      $content[] = $this->buildFailureBox(
        (array)idx((array)$failures->getData(), 'requests'),
        $hooks);
    } else {
      $content[] = $this->newDaemonFailure($webhook, $failures);
    }

    return $this->newConsolePage('webhooks', pht('Webhooks'), $content);
  }

  public static function buildHookStateBox(
    GorgeConsoleController $controller,
    $data) {

    $data = (array)$data;
    $listed = (array)idx($data, 'hooks');
    $phids = array_filter(ipull($listed, 'phid'));
    $objects = array();
    if ($phids) {
      $objects = id(new HeraldWebhookQuery())
        ->setViewer($controller->getViewer())
        ->withPHIDs($phids)
        ->execute();
      $objects = mpull($objects, null, 'getPHID');
    }
    $last_success = self::loadLastSuccess($phids);

    $rows = array();
    foreach ($listed as $hook) {
      $object = idx($objects, idx($hook, 'phid'));
      $name = idx($hook, 'name');
      $open = (idx($hook, 'breaker') === 'open');
      $rows[] = array(
        $object
          ? phutil_tag('a', array('href' => $object->getURI()), $name)
          : $name,
        idx($hook, 'status'),
        $open
          ? phutil_tag('strong', array(), pht('open'))
          : pht('closed'),
        pht(
          '%s / %s in %ss',
          idx($hook, 'failures'),
          idx($data, 'threshold'),
          idx($data, 'window')),
        number_format((int)idx($hook, 'queued')),
        self::formatSeconds(idx($hook, 'oldestQueuedSeconds')),
        phutil_tag(
          'span',
          array('data-gorge-last-success' => idx($hook, 'phid')),
          idx($last_success, idx($hook, 'phid'))
            ? phabricator_datetime(
              (int)$last_success[idx($hook, 'phid')],
              $controller->getViewer())
            : pht('never')),
      );
    }

    $table = id(new AphrontTableView($rows))
      ->setNoDataString(pht('There are no webhooks.'))
      ->setHeaders(
        array(
          pht('Hook'),
          pht('Status'),
          pht('Breaker'),
          pht('Recent Failures'),
          pht('Backlog'),
          pht('Oldest Queued'),
          pht('Last Success'),
        ))
      ->setColumnClasses(array('wide pri', '', '', '', 'n', '', ''));

    return $controller->newBox(pht('Webhooks'), $table);
  }

  /**
   * When each hook last had a request delivered, from Phorge's own rows:
   * epochs by hook PHID. The rate-limit index (webhookPHID,
   * lastRequestResult, lastRequestEpoch) answers each hook's maximum without
   * reading its requests.
   */
  private static function loadLastSuccess(array $phids) {
    if (!$phids) {
      return array();
    }
    $table = new HeraldWebhookRequest();
    $rows = queryfx_all(
      $table->establishConnection('r'),
      'SELECT webhookPHID, MAX(lastRequestEpoch) AS epoch FROM %T
        WHERE webhookPHID IN (%Ls) AND lastRequestResult = %s
        GROUP BY webhookPHID',
      $table->getTableName(),
      array_values($phids),
      HeraldWebhookRequest::RESULT_OKAY);
    return ipull($rows, 'epoch', 'webhookPHID');
  }

  private function buildFailureBox(array $requests, array $hooks) {
    $rows = array();
    foreach ($requests as $req) {
      $hook = idx($hooks, idx($req, 'hookPHID'));
      $status = idx($req, 'status');
      if ($status === 'queued') {
        $action = phutil_tag('em', array(), pht('queued again'));
      } else {
        $action = phutil_tag(
          'a',
          array(
            'href' => $this->getApplicationURI(
              'webhook/retry/'.(int)idx($req, 'id').'/'),
            'class' => 'button button-grey small',
            'data-gorge-action' => 'retry-webhook-'.(int)idx($req, 'id'),
          ),
          pht('Retry'));
      }
      $error = trim(
        idx($req, 'errorType').'/'.idx($req, 'errorCode'), '/');
      $rows[] = array(
        (int)idx($req, 'id'),
        $hook ? idx($hook, 'name') : idx($req, 'hookPHID'),
        $status,
        $error,
        $this->formatDate(idx($req, 'lastRequestEpoch')),
        $this->formatDate(idx($req, 'dateCreated')),
        $action,
      );
    }

    $table = id(new AphrontTableView($rows))
      ->setNoDataString(pht('No recent request failed.'))
      ->setHeaders(
        array(
          pht('Request'),
          pht('Hook'),
          pht('Status'),
          pht('Last Error'),
          pht('Last Attempt'),
          pht('Created'),
          pht('Actions'),
        ))
      ->setColumnClasses(array('n', 'wide', '', '', '', '', 'action'));

    return $this->newBoxWithAction(
      pht('Recent Failures'),
      $table,
      pht('Retry Failed Since...'),
      $this->getApplicationURI('webhooks/retry-since/'));
  }

}
