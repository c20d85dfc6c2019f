"""What tandem does to a deployment over any backend: ``lifecycle`` (up, down, status),
``preflight`` (the check before a start), ``health`` (the one verdict), ``supervisor`` (gang
restarts on that verdict) and ``revisions`` (what each revision of a deployment ran), for a
deployment of one group or several behind one router. Above the backends, below the tools that
measure an endpoint."""
