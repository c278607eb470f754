"""The file to give ``spark-submit``: ``sparkdp``'s command line as a Python application.

    spark-submit --master spark://host:7077 --conf spark.archives=env.tar.gz#env \\
        "$(python -c 'import sparkdp.cli.submit as s; print(s.__file__)')" train --dataset fashion-mnist ...

spark-submit runs a file (not ``-m``), as ``__main__`` outside its package, hence the
absolute import.  Under spark-submit, ``sparkdp.session`` takes the master, deploy mode and
``--conf`` settings spark-submit gave the driver instead of starting its own ``local[N]``.
``sparkdp env`` prints this file's path.
"""

import sys

from sparkdp.cli.main import main

if __name__ == "__main__":
    sys.exit(main())
