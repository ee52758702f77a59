"""What reads the environment and runs processes: settings, process groups, stop signals, the local Dask
cluster, the local Prefect server, the services, and process-level tuning (``process_tuning``, with its off
switch). It imports only ``rag_core`` and the engines themselves;
``tasks``, ``flows`` and the CLI import it."""
