base=$1; shift; cd -- "$base" && mkdir -p -- "$@" 
