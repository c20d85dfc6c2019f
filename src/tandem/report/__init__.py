"""Human views of tandem's result JSON: Markdown, terminal tables and plots.

Every view is made from a saved result model (never from a live run), so any report can be
re-rendered later from the files alone.
"""
