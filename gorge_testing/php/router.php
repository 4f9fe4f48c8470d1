<?php

// Router for PHP's built-in web server (php -S ... -t webroot router.php),
// standing in for the rewrite rule of Phorge's web server configuration:
// files that exist under webroot/ are served as they are, every other path
// goes to webroot/index.php with "__path__" set to the request path.

$path = parse_url($_SERVER['REQUEST_URI'], PHP_URL_PATH);
$file = $_SERVER['DOCUMENT_ROOT'].$path;
if ($path !== '/' && is_file($file)) {
  return false;
}

$_GET['__path__'] = $path;
$_REQUEST['__path__'] = $path;
require $_SERVER['DOCUMENT_ROOT'].'/index.php';
