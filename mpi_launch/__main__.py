import sys

from mpi_launch import main

sys.exit(main())
