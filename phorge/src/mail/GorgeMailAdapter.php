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
 *
 * With an "https://" URI, gorge-mailer's certificate is checked against the
 * system's CAs, or against the PEM file named by the "ca-bundle" option when
 * a private CA signed it.
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
        'ca-bundle' => 'string|null',
      ));

    self::requireValidURI($options['uri']);

    $bundle = $options['ca-bundle'];
    if ($bundle !== null) {
      $absolute = phutil_nonempty_string($bundle) &&
        Filesystem::isAbsolutePath($bundle);
      if (!$absolute) {
        throw new Exception(
          pht(
            'Option "ca-bundle" of a "%s" mailer must be the absolute path '.
            'of a PEM file of CA certificates, got "%s".',
            self::ADAPTERTYPE,
            $bundle));
      }
      $protocol = id(new PhutilURI($options['uri']))->getProtocol();
      if ($protocol !== 'https') {
        throw new Exception(
          pht(
            'Option "ca-bundle" of a "%s" mailer is only used with an '.
            'https:// "uri"; got "%s".',
            self::ADAPTERTYPE,
            $options['uri']));
      }
    }

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
      'ca-bundle' => null,
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

    $bundle = $this->getOption('ca-bundle');
    if ($bundle !== null) {
      // Checked here, on the host that sends, rather than when the option
      // is set: the file lives where the daemons run.
      if (!is_file($bundle) || !is_readable($bundle)) {
        throw new Exception(
          pht(
            'Option "ca-bundle" of the "%s" mailer names "%s", which is not '.
            'a readable file on this host.',
            self::ADAPTERTYPE,
            $bundle));
      }
      $future->setCABundleFromPath($bundle);
    }

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

    if ($status instanceof HTTPFutureCURLResponseStatus &&
        $this->isCertificateRefusal((int)$status->getStatusCode())) {
      throw new Exception($this->newCertificateRefusal($uri, $status));
    }

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

  private function isCertificateRefusal($curl_code) {
    $codes = array(
      CURLE_SSL_CACERT,
      CURLE_SSL_CACERT_BADFILE,
    );
    if (defined('CURLE_PEER_FAILED_VERIFICATION')) {
      $codes[] = constant('CURLE_PEER_FAILED_VERIFICATION');
    }
    if (defined('CURLE_SSL_PEER_CERTIFICATE')) {
      $codes[] = constant('CURLE_SSL_PEER_CERTIFICATE');
    }
    return in_array($curl_code, $codes, true);
  }

  /**
   * What to fix when TLS refused gorge-mailer's certificate: the URI, cURL's
   * own words and the CAs it was checked against. (arcanist's message for
   * these errors points at its own CA bundle, which is not what to change.)
   */
  private function newCertificateRefusal(
    $uri,
    HTTPFutureCURLResponseStatus $status) {

    $code = (int)$status->getStatusCode();
    $words = function_exists('curl_strerror') ? curl_strerror($code) : '';

    $bundle = $this->getOption('ca-bundle');
    if ($bundle !== null) {
      $trusted = pht(
        'it must be signed by a CA in the file of option "ca-bundle" (%s)',
        $bundle);
    } else {
      $trusted = pht(
        'it was checked against the system\'s CAs; set option "ca-bundle" '.
        'to the PEM file of the private CA that signed it');
    }

    return pht(
      'gorge-mailer at "%s" did not answer: its TLS certificate was not '.
      'accepted (cURL error %d: %s); %s, for the host named in "uri".',
      $uri,
      $code,
      $words,
      $trusted);
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
