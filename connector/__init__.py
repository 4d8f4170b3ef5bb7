"""PySpark data source ``shoal``: read and write Shoal topics from Spark.

    from shoal.connector import ShoalDataSource, client_options
    spark.dataSource.register(ShoalDataSource)
    df = (spark.read.format("shoal")
          .options(**client_options("client.properties"))
          .option("subscribe", "events")
          .load())

Options, schema and behaviour follow Spark's Kafka source; see
``docs/spark.md``.
"""

from shoal.connector.properties import client_options
from shoal.connector.source import ShoalDataSource

__all__ = ["ShoalDataSource", "client_options"]
