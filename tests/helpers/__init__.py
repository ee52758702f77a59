"""Builders shared by test modules: each module here is named for what it builds."""
