"""Verifying: a plan's training step measured against the unchecked step on this machine."""
