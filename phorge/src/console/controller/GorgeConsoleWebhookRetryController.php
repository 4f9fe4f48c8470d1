<?php

/**
 * Put one sent or failed webhook request back in gorge-webhook's queue.
 */
final class GorgeConsoleWebhookRetryController
  extends GorgeConsoleController {

  public function handleRequest(AphrontRequest $request) {
    $id = (int)$request->getURIData('id');
    $viewer = $this->getViewer();
    $done_uri = $this->getApplicationURI('webhooks/');

    $webhook = GorgeDaemon::loadDaemon(GorgeDaemon::WEBHOOK);
    if (!$webhook) {
      return $this->newNotConfiguredDialog(
        'webhook', pht('retry requests'), $done_uri);
    }

    $errors = array();
    if ($request->isFormPost()) {
      $request_id = GorgeDaemon::newActorRequestID($viewer);
      $future = $webhook->newFuture(
        'POST',
        '/api/webhook/requests/'.$id.'/retry',
        array(),
        // "{}": the route takes an empty object, not a list.
        new stdClass())
        ->addHeader('X-Request-Id', $request_id);
      $answer = GorgeDaemonAnswer::newFromFuture($future);

      $this->logAction(
        array(
          'daemon' => $webhook->getDisplayName(),
          'action' => 'retry-webhook-request',
          'requestID' => $request_id,
          'webhookRequestID' => $id,
          'httpStatus' => $answer->getHTTPStatus(),
          'outcome' => $answer->isOK() ? 'done' : $answer->describeFailure(),
        ));

      if ($answer->isOK()) {
        return id(new AphrontRedirectResponse())->setURI($done_uri);
      }
      $errors[] = $answer->describeFailure();
    }

    return $this->newDialog()
      ->setTitle(pht('Retry Webhook Request %d', $id))
      ->setErrors($errors)
      ->appendParagraph(
        pht(
          'The request goes back in the queue and gorge-webhook delivers it '.
          'again, once, with the same body and signature.'))
      ->addSubmitButton(pht('Retry Webhook Request %d', $id))
      ->addCancelButton($done_uri);
  }

}
