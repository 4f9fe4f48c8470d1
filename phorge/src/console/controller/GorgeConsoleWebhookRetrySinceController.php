<?php

/**
 * Retry a hook's failed requests created since a time: choose the hook and
 * the time, see how many requests that is, then confirm
 * (/api/webhook/requests/retry, followed to the end of the range).
 */
final class GorgeConsoleWebhookRetrySinceController
  extends GorgeConsoleController {

  // Pages of /api/webhook/requests counted, and calls of the retry route,
  // before the console stops and says there may be more.
  const MAX_PAGES = 10;

  public function handleRequest(AphrontRequest $request) {
    $viewer = $this->getViewer();
    $done_uri = $this->getApplicationURI('webhooks/');
    $webhook = GorgeDaemon::loadDaemon(GorgeDaemon::WEBHOOK);
    if (!$webhook) {
      return $this->newNotConfiguredDialog(
        'webhook', pht('retry requests'), $done_uri);
    }

    $state = $webhook->call('GET', '/api/webhook/hooks/state');
    if (!$state->isOK()) {
      return $this->newDialog()
        ->setTitle(pht('gorge-webhook Did Not Answer'))
        ->appendParagraph($state->describeFailure())
        ->addCancelButton($done_uri);
    }
    $hooks = array();
    foreach ((array)idx((array)$state->getData(), 'hooks') as $hook) {
      $hooks[idx($hook, 'phid')] = idx($hook, 'name');
    }

    $step = $request->getStr('step');
    $hook_phid = $request->getStr('hookPHID');
    $known = isset($hooks[$hook_phid]);

    if ($request->isFormPost() && $step === 'confirm' && $known) {
      return $this->retry(
        $webhook,
        $hook_phid,
        $hooks[$hook_phid],
        $request->getInt('since'),
        $done_uri);
    }

    if ($request->isFormPost() && $step === 'preview' && $known) {
      $since = PhabricatorTime::getNow() - $request->getInt('window');
      list($count, $more) = $this->countFailed($webhook, $hook_phid, $since);
      $dialog = $this->newDialog()
        ->setTitle(pht('Retry Failed Requests of %s', $hooks[$hook_phid]))
        ->addHiddenInput('step', 'confirm')
        ->addHiddenInput('hookPHID', $hook_phid)
        ->addHiddenInput('since', $since)
        ->addCancelButton($done_uri);
      if ($count === null) {
        return $dialog->appendParagraph($more);
      }
      if (!$count && !$more) {
        return $dialog->appendParagraph(
          pht('No request of this hook created since %s has failed.',
            $this->formatDate($since)));
      }
      return $dialog
        ->appendParagraph(
          pht(
            '%s%s failed request(s) of %s created since %s go back in the '.
            'queue; gorge-webhook delivers each once more.',
            $more ? pht('At least').' ' : '',
            new PhutilNumber($count),
            $hooks[$hook_phid],
            $this->formatDate($since)))
        ->addSubmitButton(pht('Retry Them'));
    }

    $windows = array(
      3600 => pht('the last hour'),
      6 * 3600 => pht('the last 6 hours'),
      86400 => pht('the last day'),
      7 * 86400 => pht('the last 7 days'),
    );
    $form = id(new AphrontFormView())
      ->setViewer($viewer)
      ->appendChild(
        id(new AphrontFormSelectControl())
          ->setLabel(pht('Hook'))
          ->setName('hookPHID')
          ->setOptions($hooks))
      ->appendChild(
        id(new AphrontFormSelectControl())
          ->setLabel(pht('Created In'))
          ->setName('window')
          ->setValue(86400)
          ->setOptions($windows));

    return $this->newDialog()
      ->setTitle(pht('Retry Failed Webhook Requests'))
      ->addHiddenInput('step', 'preview')
      ->appendForm($form)
      ->addSubmitButton(pht('Count Them'))
      ->addCancelButton($done_uri);
  }

  /**
   * (count, more?) of the hook's failed requests created since $since, or
   * (null, why) when gorge-webhook did not answer.
   */
  private function countFailed(GorgeDaemon $webhook, $hook_phid, $since) {
    $count = 0;
    $cursor = null;
    for ($page = 0; $page < self::MAX_PAGES; $page++) {
      $query = array(
        'hook' => $hook_phid,
        'status' => 'failed',
        'since' => $since,
        'limit' => 1000,
      );
      if ($cursor !== null) {
        $query['cursor'] = $cursor;
      }
      $answer = $webhook->call('GET', '/api/webhook/requests', $query);
      if (!$answer->isOK()) {
        return array(null, $answer->describeFailure());
      }
      $data = (array)$answer->getData();
      $count += count((array)idx($data, 'requests'));
      $cursor = idx($data, 'nextCursor');
      if ($cursor === null) {
        return array($count, false);
      }
    }
    return array($count, true);
  }

  private function retry(GorgeDaemon $webhook, $hook_phid, $name, $since,
    $done_uri) {

    $viewer = $this->getViewer();
    $request_id = GorgeDaemon::newActorRequestID($viewer);
    $retried = 0;
    $skipped = 0;
    $after = 0;
    $error = null;
    for ($call = 0; $call < self::MAX_PAGES; $call++) {
      $future = $webhook->newFuture(
        'POST',
        '/api/webhook/requests/retry',
        array(),
        array(
          'hookPHID' => $hook_phid,
          'since' => (int)$since,
          'status' => 'failed',
          'afterId' => (int)$after,
        ))
        ->addHeader('X-Request-Id', $request_id);
      $answer = GorgeDaemonAnswer::newFromFuture($future);
      if (!$answer->isOK()) {
        $error = $answer->describeFailure();
        break;
      }
      $data = (array)$answer->getData();
      $retried += count((array)idx($data, 'retried'));
      $skipped += count((array)idx($data, 'skipped'));
      $after = idx($data, 'nextAfterId');
      if ($after === null) {
        break;
      }
    }

    $this->logAction(
      array(
        'daemon' => $webhook->getDisplayName(),
        'action' => 'retry-webhook-since',
        'hookPHID' => $hook_phid,
        'since' => (int)$since,
        'retried' => $retried,
        'skipped' => $skipped,
        'requestID' => $request_id,
        'outcome' => ($error === null) ? 'done' : $error,
      ));

    $dialog = $this->newDialog()
      ->setTitle(pht('Retried %s Requests', new PhutilNumber($retried)))
      ->appendParagraph(
        pht(
          '%s failed request(s) of %s are back in the queue.',
          new PhutilNumber($retried),
          $name))
      ->addCancelButton($done_uri, pht('Done'));
    $errors = array();
    if ($skipped) {
      $errors[] = pht(
        '%s request(s) changed while being put back; retry them one by one.',
        new PhutilNumber($skipped));
    }
    if ($error !== null) {
      $errors[] = $error;
    }
    if ($after !== null && $error === null) {
      $errors[] = pht('There may be more; run this again.');
    }
    return $dialog->setErrors($errors);
  }

}
