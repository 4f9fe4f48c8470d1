<?php

phutil_register_library('gorge', __FILE__);
