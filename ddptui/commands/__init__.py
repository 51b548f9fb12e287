"""One module per ``ddptui`` command; ``ddptui.cli`` imports a module only when its command runs."""
