"""What every strom service shares: gRPC server setup, health, reflection, metrics, logging,
configuration sources and graceful shutdown (DESIGN §2)."""
