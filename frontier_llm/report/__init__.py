"""Weak and strong scaling reports and figures."""
