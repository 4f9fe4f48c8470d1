<?php

/**
 * A link to the gorge console on Phorge's own daemon console (`/daemon/`):
 * with gorge running the queue, that is where an administrator looking at
 * the daemons goes next. Phorge's main menu bar is the place it lets a
 * library add to that page without a patch; the link shows on the Daemons
 * application's pages only, and only to administrators (the console is
 * theirs alone).
 */
final class GorgeDaemonConsoleMainMenuBarExtension
  extends PhabricatorMainMenuBarExtension {

  const MAINMENUBARKEY = 'gorge.daemon-console';

  public function isExtensionEnabledForViewer(PhabricatorUser $viewer) {
    if (!parent::isExtensionEnabledForViewer($viewer)) {
      return false;
    }
    if (!$viewer->getIsAdmin()) {
      return false;
    }
    return ($this->getApplication() instanceof PhabricatorDaemonsApplication);
  }

  public function buildMainMenus() {
    return array(
      id(new PHUIButtonView())
        ->setTag('a')
        ->setHref('/gorge/')
        ->setText(pht('gorge Console'))
        ->setNoCSS(true)
        ->addClass('phabricator-core-login-button')
        ->addClass('gorge-daemon-console-link'),
    );
  }

}
