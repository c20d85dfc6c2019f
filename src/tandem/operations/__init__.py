"""What tandem does to a deployment over any backend: ``lifecycle`` (up, down, status),
``preflight`` (the check before a start), ``health`` (the one verdict), ``supervisor`` (gang
restarts on that verdict), ``revisions`` (what each ``up`` ran) and ``fleet`` (several groups
behind one router). Above the backends, below the tools that measure an endpoint."""
