"""What every learned method's training shares: the cached target hidden states, the resumable
training loop and the checkpoint format (with its compatibility check against the target)."""
