<?php

/**
 * Builds the body of gorge-mailer's `POST /api/mailer/send` from an outbound
 * email, with the field names and shapes that gorge's docs/mailer.md
 * documents for that route.
 */
final class GorgeMailMessageSerializer extends Phobject {

  public function newRequestBody(PhabricatorMailEmailMessage $message) {
    return array(
      'message' => $this->newMessageDictionary($message),
    );
  }

  public function newMessageDictionary(PhabricatorMailEmailMessage $message) {
    $dict = array();

    $from = $message->getFromAddress();
    if ($from) {
      $dict['from'] = $this->newAddress($from);
    }

    $reply_to = $message->getReplyToAddress();
    if ($reply_to) {
      $dict['replyTo'] = $this->newAddress($reply_to);
    }

    $to = $message->getToAddresses();
    if ($to) {
      $dict['to'] = $this->newAddressList($to);
    }

    $cc = $message->getCCAddresses();
    if ($cc) {
      $dict['cc'] = $this->newAddressList($cc);
    }

    $subject = $message->getSubject();
    if ($subject !== null) {
      $dict['subject'] = (string)$subject;
    }

    // gorge-mailer treats an absent body as "no such part"; Phorge leaves a
    // part it did not build as null or empty.
    $text_body = $message->getTextBody();
    if (phutil_nonempty_string($text_body)) {
      $dict['textBody'] = $text_body;
    }

    $html_body = $message->getHTMLBody();
    if (phutil_nonempty_string($html_body)) {
      $dict['htmlBody'] = $html_body;
    }

    $headers = $message->getHeaders();
    if ($headers) {
      $list = array();
      foreach ($headers as $header) {
        $list[] = array(
          'name' => (string)$header->getName(),
          'value' => (string)$header->getValue(),
        );
      }
      $dict['headers'] = $list;
    }

    $attachments = $message->getAttachments();
    if ($attachments) {
      $list = array();
      foreach ($attachments as $attachment) {
        $list[] = array(
          'filename' => (string)$attachment->getFilename(),
          'mimeType' => $attachment->getMimeType(),
          'data' => base64_encode((string)$attachment->getData()),
        );
      }
      $dict['attachments'] = $list;
    }

    return $dict;
  }

  private function newAddress(PhutilEmailAddress $address) {
    return array(
      'name' => (string)$address->getDisplayName(),
      'address' => (string)$address->getAddress(),
    );
  }

  private function newAddressList(array $addresses) {
    $list = array();
    foreach ($addresses as $address) {
      $list[] = $this->newAddress($address);
    }
    return $list;
  }

}
