<?php

/**
 * The gorge daemons the library talks to: their base URIs and service
 * tokens. Locked (only `bin/config` on the host may set it) and hidden (the
 * web interface never shows the value), because the tokens are the daemons'
 * keys; they are read server side only and never put into a page.
 */
final class GorgeConfigOptions
  extends PhabricatorApplicationConfigOptions {

  public function getName() {
    return pht('gorge');
  }

  public function getDescription() {
    return pht('Where the gorge daemons listen, for the gorge console and setup checks.');
  }

  public function getIcon() {
    return 'fa-cogs';
  }

  public function getGroup() {
    return 'core';
  }

  public function getOptions() {
    $example = array(
      'taskqueue' => array(
        'uri' => 'http://127.0.0.1:8090',
        'token' => 'the-taskqueue-service-token',
      ),
      'worker' => array('uri' => 'http://127.0.0.1:8170', 'token' => '...'),
      'webhook' => array('uri' => 'http://127.0.0.1:8160', 'token' => '...'),
      'mailer' => array('uri' => 'http://127.0.0.1:8110', 'token' => '...'),
    );

    return array(
      $this->newOption('gorge.daemons', 'wild', array())
        ->setLocked(true)
        ->setHidden(true)
        ->setSummary(pht('The gorge daemons: base URI and service token of each.'))
        ->setDescription(
          pht(
            'A map from daemon name (%s) to an object with its base URI '.
            '("uri", http or https) and its service token ("token", the '.
            'daemon\'s GORGE_SERVICE_TOKEN; empty when it has none). Each '.
            'daemon named here gets a setup check and a place in the gorge '.
            'console at /gorge/. Leave a daemon out if it is not deployed.',
            implode(', ', GorgeDaemon::getDaemonNames())))
        ->addExample(
          id(new PhutilJSON())->encodeFormatted($example),
          pht('All four daemons on this host')),
    );
  }

  protected function didValidateOption(
    PhabricatorConfigOption $option,
    $value) {

    if ($option->getKey() !== 'gorge.daemons') {
      return;
    }

    try {
      GorgeDaemon::newDaemonsFromConfig($value);
    } catch (Exception $ex) {
      throw new PhabricatorConfigValidationException($ex->getMessage());
    }
  }

}
