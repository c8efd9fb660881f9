# The private directory of requests and prompt files, in the login directory.
umask 077
mkdir -p .cache/bmoe-edge/req && chmod 700 .cache/bmoe-edge/req
