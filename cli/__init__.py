"""The ``nexus`` command line (cli/main.py): runs services, clusters, training and evaluations."""
