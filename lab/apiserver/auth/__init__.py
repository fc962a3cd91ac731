"""Authentication and authorization of the lab's Kubernetes API server emulator."""
