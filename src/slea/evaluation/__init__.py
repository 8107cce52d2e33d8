"""Held-out evaluation, paper-style tables, the HTML report and the frozen-model agent."""
