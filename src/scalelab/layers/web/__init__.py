"""Shared HTTP plumbing for the project's servers: guard, read timeout, access log, runner."""
