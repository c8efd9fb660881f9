printf '%s' "${XDG_CONFIG_HOME:-$HOME/.config}" 
