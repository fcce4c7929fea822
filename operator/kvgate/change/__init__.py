"""What kvgate writes: canary and Job manifests, the production container's change and its undo, the GitOps file."""
