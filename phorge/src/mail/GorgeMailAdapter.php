<?php

/**
 * Mail adapter of type "gorge": hands each outbound email to gorge-mailer
 * (`POST {uri}/api/mailer/send`) and turns its answer into the outcome
 * Phorge acts on.
 *
 * Every mail carries an `Idempotency-Key`: the PHID of its
 * PhabricatorMetaMTAMail, which stays the same when Phorge retries the mail
 * (the body does not: Phorge stamps a fresh X-Phabricator-Send-Attempt into
 * it each time). gorge-mailer answers a repeated key with the outcome of its
 * first send instead of sending again, so a retry after an answer that was
 * lost (a timeout, a dropped connection) delivers nothing twice.
 *
 * Example `cluster.mailers` entry:
 *
 *   {
 *     "key": "gorge",
 *     "type": "gorge",
 *     "inbound": false,
 *     "options": {
 *       "uri": "http://127.0.0.1:8110",
 *       "token": "the GORGE_SERVICE_TOKEN of gorge-mailer"
 *     }
 *   }
 */
final class GorgeMailAdapter extends PhabricatorMailAdapter {

  const ADAPTERTYPE = 'gorge';

  const SEND_PATH = '/api/mailer/send';
  const DEFAULT_TIMEOUT = 30;
  const IDEMPOTENCY_HEADER = 'Idempotency-Key';
  const MAIL_ID_HEADER = 'X-Phabricator-Mail-ID';

  public function getSupportedMessageTypes() {
    return array(
      PhabricatorMailEmailMessage::MESSAGETYPE,
    );
  }

  public function supportsMessageIDHeader() {
    return (bool)$this->getOption('supports-message-id');
  }

  protected function validateOptions(array $options) {
    PhutilTypeSpec::checkMap(
      $options,
      array(
        'uri' => 'string|null',
        'token' => 'string|null',
        'timeout' => 'int|null',
        'supports-message-id' => 'bool|null',
      ));

    self::requireValidURI($options['uri']);

    $timeout = $options['timeout'];
    if ($timeout !== null && $timeout < 0) {
      throw new Exception(
        pht(
          'Option "timeout" of a "%s" mailer must be a number of seconds '.
          '(0 or more; 0 means the default of %d), got %d.',
          self::ADAPTERTYPE,
          self::DEFAULT_TIMEOUT,
          $timeout));
    }
  }

  public function newDefaultOptions() {
    return array(
      'uri' => null,
      'token' => null,
      'timeout' => self::DEFAULT_TIMEOUT,
      'supports-message-id' => false,
    );
  }

  public function sendMessage(PhabricatorMailExternalMessage $message) {
    $body = id(new GorgeMailMessageSerializer())
      ->newRequestBody($message);

    try {
      $json = phutil_json_encode($body);
    } catch (Throwable $ex) {
      // The same message would fail the same way on every retry.
      throw new PhabricatorMetaMTAPermanentFailureException(
        pht(
          'The mail could not be encoded for gorge-mailer: %s',
          $ex->getMessage()));
    }

    $uri = rtrim($this->getOption('uri'), '/').self::SEND_PATH;

    $timeout = $this->getOption('timeout');
    if (!$timeout) {
      $timeout = self::DEFAULT_TIMEOUT;
    }

    $future = id(new HTTPSFuture($uri))
      ->setMethod('POST')
      ->setTimeout($timeout)
      ->setFollowLocation(false)
      ->addHeader('Content-Type', 'application/json')
      ->addHeader('Accept', 'application/json')
      ->setData($json);

    $token = $this->getOption('token');
    if (phutil_nonempty_string($token)) {
      $future->addHeader('X-Service-Token', $token);
    }

    $key = $this->newIdempotencyKey($message);
    if ($key !== null) {
      $future->addHeader(self::IDEMPOTENCY_HEADER, $key);
    }

    list($status, $response_body) = $future->resolve();

    $this->interpretAnswer($uri, $status, $response_body);
  }

  /**
   * The PHID of the mail this message was built from, found through the
   * mail ID Phorge writes into its headers; null for a message that names no
   * stored mail (it is then sent without a key, as before).
   */
  private function newIdempotencyKey(PhabricatorMailExternalMessage $message) {
    if (!($message instanceof PhabricatorMailEmailMessage)) {
      return null;
    }

    $mail_id = null;
    foreach ($message->getHeaders() as $header) {
      $name = phutil_utf8_strtolower((string)$header->getName());
      if ($name === phutil_utf8_strtolower(self::MAIL_ID_HEADER)) {
        $mail_id = (string)$header->getValue();
      }
    }

    if ($mail_id === null || !ctype_digit($mail_id)) {
      return null;
    }

    $mail = id(new PhabricatorMetaMTAMail())->load((int)$mail_id);
    if (!$mail || !phutil_nonempty_string($mail->getPHID())) {
      return null;
    }

    return $mail->getPHID();
  }

  private function interpretAnswer(
    $uri,
    HTTPFutureResponseStatus $status,
    $response_body) {

    if (!($status instanceof HTTPFutureHTTPResponseStatus)) {
      // No HTTP answer at all (refused, reset, timed out): Phorge may try
      // its next mailer and retry later. gorge-mailer may have sent the mail
      // meanwhile; the retry carries the same Idempotency-Key, so it is
      // answered with that send's outcome instead of being sent again.
      throw new Exception(
        pht(
          'gorge-mailer at "%s" did not answer: %s',
          $uri,
          $status->getMessage()));
    }

    $http_code = (int)$status->getStatusCode();
    if ($http_code >= 200 && $http_code < 300) {
      return;
    }

    list($error_code, $error_message) = $this->readErrorEnvelope(
      $response_body);

    if ($http_code === 422 && $error_code === 'ERR_PERMANENT_FAILURE') {
      throw new PhabricatorMetaMTAPermanentFailureException(
        pht(
          'gorge-mailer rejected the mail permanently: %s',
          $error_message));
    }

    if ($http_code === 502 && $error_code === 'ERR_OUTCOME_UNKNOWN') {
      throw new PhabricatorMetaMTAPermanentFailureException(
        pht(
          'The outcome of sending this mail through gorge-mailer is '.
          'unknown (%s): a mail server may have accepted it. It was not '.
          'sent again, to avoid delivering it twice.',
          $error_message));
    }

    throw new Exception(
      pht(
        'gorge-mailer at "%s" did not send the mail (HTTP %d, %s): %s',
        $uri,
        $http_code,
        phutil_nonempty_string($error_code) ? $error_code : pht('no code'),
        $error_message));
  }

  private function readErrorEnvelope($response_body) {
    $doc = json_decode($response_body, true);
    $error = is_array($doc) ? idx($doc, 'error') : null;
    if (!is_array($error)) {
      $snippet = id(new PhutilUTF8StringTruncator())
        ->setMaximumGlyphs(200)
        ->truncateString(trim((string)$response_body));
      return array(null, $snippet);
    }

    $code = idx($error, 'code');
    $message = idx($error, 'message');
    return array(
      is_string($code) ? $code : null,
      is_string($message) ? $message : '',
    );
  }

  private static function requireValidURI($uri) {
    $example = 'http://127.0.0.1:8110';

    if (!phutil_nonempty_string($uri)) {
      throw new Exception(
        pht(
          'Option "uri" of a "%s" mailer is required: set it to the base '.
          'URI of gorge-mailer, for example "%s".',
          self::ADAPTERTYPE,
          $example));
    }

    $parsed = new PhutilURI($uri);
    $protocol = $parsed->getProtocol();
    if ($protocol !== 'http' && $protocol !== 'https') {
      throw new Exception(
        pht(
          'Option "uri" of a "%s" mailer must be an http:// or https:// '.
          'URI of gorge-mailer, for example "%s"; got "%s".',
          self::ADAPTERTYPE,
          $example,
          $uri));
    }

    if (!phutil_nonempty_string($parsed->getDomain())) {
      throw new Exception(
        pht(
          'Option "uri" of a "%s" mailer must name the host of '.
          'gorge-mailer, for example "%s"; got "%s".',
          self::ADAPTERTYPE,
          $example,
          $uri));
    }

    if ($parsed->getQueryParamsAsPairList() || $parsed->getFragment()) {
      throw new Exception(
        pht(
          'Option "uri" of a "%s" mailer must be a base URI without a query '.
          'or fragment, for example "%s"; got "%s".',
          self::ADAPTERTYPE,
          $example,
          $uri));
    }
  }

}
