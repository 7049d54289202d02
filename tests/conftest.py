"""Shared pytest fixtures for agentrl's tests."""
