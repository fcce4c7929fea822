"""What happens next: the state machine, its steps, deadlines, promotion and the pull-request path."""
