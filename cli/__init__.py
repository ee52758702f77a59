"""The ``wikirag`` command line: the top layer. It imports the flows, the tasks' adapters and the runtime;
nothing imports it. ``cli.wikirag`` builds the parser and runs the commands."""
