"""Node programs that run inside operand pods."""
