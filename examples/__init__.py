"""Scripts and resource specs that show Stratagem at work (`python -m examples.demo`); not an installed package."""
