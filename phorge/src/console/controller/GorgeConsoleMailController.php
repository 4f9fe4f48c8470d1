<?php

final class GorgeConsoleMailController extends GorgeConsoleController {

  const RECENT_MAIL = 50;
  const SUMMARY_WINDOW = 86400;

  public function handleRequest(AphrontRequest $request) {
    $mailer = GorgeDaemon::loadDaemon(GorgeDaemon::MAILER);

    $content = array();
    $content[] = $this->buildMailerSummaryBox($mailer);
    $content[] = $this->buildRecentBox();

    return $this->newConsolePage('mail', pht('Mail'), $content);
  }

  /**
   * Mail of the last day per mailer, from Phorge's outbound mail table
   * (each sent mail records the key of the mailer that took it), beside the
   * backends gorge-mailer reports.
   */
  public function buildMailerSummaryBox($mailer) {
    $counts = array();
    $mails = id(new PhabricatorMetaMTAMail())->loadAllWhere(
      'dateCreated >= %d ORDER BY id DESC LIMIT 1000',
      PhabricatorTime::getNow() - self::SUMMARY_WINDOW);
    foreach ($mails as $mail) {
      $key = $mail->getMailerKey();
      $key = ($key === null) ? '' : $key;
      $status = $mail->getStatus();
      if (!isset($counts[$key])) {
        $counts[$key] = array();
      }
      $counts[$key][$status] = idx($counts[$key], $status, 0) + 1;
    }

    $backends = null;
    if ($mailer) {
      $answer = $mailer->call('GET', '/api/mailer/mailers');
      if ($answer->isOK()) {
        $backends = array();
        foreach ((array)$answer->getData() as $backend) {
          $backends[] = idx($backend, 'key').' ('.idx($backend, 'type').')';
        }
        $backends = implode(', ', $backends);
      } else {
        $backends = $answer->describeFailure();
      }
    }

    $rows = array();
    foreach ($counts as $key => $by_status) {
      $rows[] = array(
        strlen($key) ? $key : phutil_tag('em', array(), pht('none yet')),
        number_format(idx($by_status, PhabricatorMailOutboundStatus::STATUS_SENT, 0)),
        number_format(idx($by_status, PhabricatorMailOutboundStatus::STATUS_FAIL, 0)),
        number_format(idx($by_status, PhabricatorMailOutboundStatus::STATUS_QUEUE, 0)),
        ($key === GorgeMailAdapter::ADAPTERTYPE || $key === 'gorge')
          ? $backends
          : null,
      );
    }

    $table = id(new AphrontTableView($rows))
      ->setNoDataString(pht('No mail in the last day.'))
      ->setHeaders(
        array(
          pht('Mailer'),
          pht('Sent'),
          pht('Failed'),
          pht('Queued'),
          pht('gorge-mailer Backends'),
        ))
      ->setColumnClasses(array('pri', 'n', 'n', 'n', 'wide'));

    return $this->newBox(pht('Mail in the Last Day, per Mailer'), $table);
  }

  private function buildRecentBox() {
    $mails = id(new PhabricatorMetaMTAMail())->loadAllWhere(
      '1 = 1 ORDER BY id DESC LIMIT %d',
      self::RECENT_MAIL);

    $rows = array();
    foreach ($mails as $mail) {
      $rows[] = array(
        phutil_tag(
          'a',
          array('href' => '/mail/detail/'.$mail->getID().'/'),
          $mail->getID()),
        $mail->getStatus(),
        $mail->getMailerKey(),
        $mail->getMessage(),
        $this->formatDate($mail->getDateModified()),
      );
    }

    $table = id(new AphrontTableView($rows))
      ->setNoDataString(pht('No outbound mail.'))
      ->setHeaders(
        array(
          pht('Mail'),
          pht('Status'),
          pht('Mailer'),
          pht('Message'),
          pht('Updated'),
        ))
      ->setColumnClasses(array('n', '', '', 'wide', ''));

    return $this->newBox(pht('Recent Outbound Mail'), $table);
  }

}
