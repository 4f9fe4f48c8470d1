<?php

/**
 * What a gorge daemon answered: the HTTP status and the decoded body of
 * gorge's envelope ({"data": ...} or {"error": {"code", "message"}}), or why
 * there was no answer at all.
 */
final class GorgeDaemonAnswer extends Phobject {

  private $httpStatus;
  private $body;
  private $transportError;

  public static function newFromFuture(HTTPSFuture $future) {
    $answer = new self();
    try {
      list($status, $body) = $future->resolve();
    } catch (Exception $ex) {
      $answer->transportError = $ex->getMessage();
      return $answer;
    }

    if ($status instanceof HTTPFutureHTTPResponseStatus) {
      $answer->httpStatus = (int)$status->getStatusCode();
    } else {
      // cURL's own failure: refused, timed out, unresolvable.
      $answer->transportError = self::describeTransportFailure($status);
      return $answer;
    }

    $decoded = null;
    if (strlen($body)) {
      try {
        $decoded = phutil_json_decode($body);
      } catch (PhutilJSONParserException $ex) {
        $decoded = null;
      }
    }
    $answer->body = $decoded;
    return $answer;
  }

  /**
   * A short cause: cURL's own messages are paragraphs, and name the URI,
   * which the page shows beside it anyway.
   */
  private static function describeTransportFailure(
    HTTPFutureResponseStatus $status) {

    if ($status instanceof HTTPFutureCURLResponseStatus) {
      $code = $status->getStatusCode();
      $causes = array(
        CURLE_COULDNT_CONNECT => pht('connection refused'),
        CURLE_OPERATION_TIMEOUTED => pht('timed out'),
        CURLE_COULDNT_RESOLVE_HOST => pht('host not found'),
        CURLE_SSL_CONNECT_ERROR => pht('TLS handshake failed'),
      );
      return idx($causes, $code, pht('cURL error %d', $code));
    }
    if ($status->isTimeout()) {
      return pht('timed out');
    }
    return pht('transport error %s', $status->getStatusCode());
  }

  public function isReachable() {
    return ($this->transportError === null);
  }

  public function getHTTPStatus() {
    return $this->httpStatus;
  }

  public function isOK() {
    return $this->isReachable() &&
      $this->httpStatus >= 200 &&
      $this->httpStatus < 300;
  }

  public function getBody() {
    return $this->body;
  }

  public function getData() {
    if (is_array($this->body) && array_key_exists('data', $this->body)) {
      return $this->body['data'];
    }
    return null;
  }

  public function getErrorCode() {
    $error = idx((array)$this->body, 'error');
    return is_array($error) ? idx($error, 'code') : null;
  }

  /**
   * One line saying what went wrong, for a page or a setup issue. Never the
   * request's headers (the token).
   */
  public function describeFailure() {
    if ($this->transportError !== null) {
      return pht('no answer: %s', $this->transportError);
    }
    $error = idx((array)$this->body, 'error');
    if (is_array($error)) {
      return pht(
        'HTTP %d %s: %s',
        $this->httpStatus,
        idx($error, 'code', ''),
        idx($error, 'message', ''));
    }
    $reason = idx((array)$this->body, 'reason');
    if (is_string($reason)) {
      return pht('HTTP %d: %s', $this->httpStatus, $reason);
    }
    return pht('HTTP %d', $this->httpStatus);
  }

}
