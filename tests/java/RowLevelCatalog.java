package pgdecode.testing;

import java.util.ArrayList;
import java.util.Collections;
import java.util.EnumSet;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;

import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.catalyst.expressions.GenericInternalRow;
import org.apache.spark.sql.catalyst.analysis.NoSuchTableException;
import org.apache.spark.sql.catalyst.analysis.TableAlreadyExistsException;
import org.apache.spark.sql.connector.catalog.Identifier;
import org.apache.spark.sql.connector.catalog.SupportsRead;
import org.apache.spark.sql.connector.catalog.SupportsRowLevelOperations;
import org.apache.spark.sql.connector.catalog.SupportsWrite;
import org.apache.spark.sql.connector.catalog.Table;
import org.apache.spark.sql.connector.catalog.TableCapability;
import org.apache.spark.sql.connector.catalog.TableCatalog;
import org.apache.spark.sql.connector.catalog.TableChange;
import org.apache.spark.sql.connector.expressions.Transform;
import org.apache.spark.sql.connector.read.Batch;
import org.apache.spark.sql.connector.read.InputPartition;
import org.apache.spark.sql.connector.read.PartitionReader;
import org.apache.spark.sql.connector.read.PartitionReaderFactory;
import org.apache.spark.sql.connector.read.Scan;
import org.apache.spark.sql.connector.read.ScanBuilder;
import org.apache.spark.sql.connector.write.BatchWrite;
import org.apache.spark.sql.connector.write.DataWriter;
import org.apache.spark.sql.connector.write.DataWriterFactory;
import org.apache.spark.sql.connector.write.LogicalWriteInfo;
import org.apache.spark.sql.connector.write.PhysicalWriteInfo;
import org.apache.spark.sql.connector.write.RowLevelOperation;
import org.apache.spark.sql.connector.write.RowLevelOperationBuilder;
import org.apache.spark.sql.connector.write.RowLevelOperationInfo;
import org.apache.spark.sql.connector.write.SupportsTruncate;
import org.apache.spark.sql.connector.write.Write;
import org.apache.spark.sql.connector.write.WriteBuilder;
import org.apache.spark.sql.connector.write.WriterCommitMessage;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;

/**
 * A catalog of in-memory tables that take Spark SQL's MERGE INTO, UPDATE and DELETE (row-level
 * operations, copy-on-write), INSERT and INSERT OVERWRITE: what Delta Lake and Iceberg tables
 * take, for tests of the MERGE INTO recipe on a machine without their jars. Spark plans and
 * runs the statements itself; this only holds the rows.
 *
 * A table is one group: a row-level operation reads every row, and its write replaces them
 * all with the rows Spark writes back. Rows go to the tasks in their partitions and come
 * back in the commit messages; the table keeps them in the driver (local mode).
 */
public class RowLevelCatalog implements TableCatalog {
    static final Map<Identifier, MemTable> TABLES = new ConcurrentHashMap<>();

    private String name;

    @Override
    public void initialize(String name, CaseInsensitiveStringMap options) {
        this.name = name;
    }

    @Override
    public String name() {
        return name;
    }

    @Override
    public Identifier[] listTables(String[] namespace) {
        return TABLES.keySet().stream()
                .filter(id -> java.util.Arrays.equals(id.namespace(), namespace))
                .toArray(Identifier[]::new);
    }

    @Override
    public Table loadTable(Identifier ident) throws NoSuchTableException {
        MemTable table = TABLES.get(ident);
        if (table == null) {
            throw new NoSuchTableException(ident);
        }
        return table;
    }

    @Override
    @SuppressWarnings("deprecation")
    public Table createTable(Identifier ident, StructType schema, Transform[] partitions,
                             Map<String, String> properties) throws TableAlreadyExistsException {
        MemTable table = new MemTable(ident.toString(), schema);
        if (TABLES.putIfAbsent(ident, table) != null) {
            throw new TableAlreadyExistsException(ident.toString());
        }
        return table;
    }

    /** ADD COLUMNS only: the new columns are NULL in the rows there are. */
    @Override
    public Table alterTable(Identifier ident, TableChange... changes) throws NoSuchTableException {
        MemTable table = (MemTable) loadTable(ident);
        StructType schema = table.schema;
        for (TableChange change : changes) {
            if (!(change instanceof TableChange.AddColumn)) {
                throw new UnsupportedOperationException(
                        "this test catalog's ALTER TABLE only adds columns, not " + change);
            }
            TableChange.AddColumn add = (TableChange.AddColumn) change;
            schema = schema.add(add.fieldNames()[0], add.dataType(), true);
        }
        StructField[] old = table.schema.fields();
        List<InternalRow> rows = new ArrayList<>();
        for (InternalRow row : table.rows) {
            Object[] values = new Object[schema.size()];
            for (int i = 0; i < old.length; i++) {
                values[i] = row.get(i, old[i].dataType());
            }
            rows.add(new GenericInternalRow(values));
        }
        MemTable altered = new MemTable(table.name, schema);
        altered.rows = Collections.unmodifiableList(rows);
        TABLES.put(ident, altered);
        return altered;
    }

    @Override
    public boolean dropTable(Identifier ident) {
        return TABLES.remove(ident) != null;
    }

    @Override
    public void renameTable(Identifier from, Identifier to) {
        throw new UnsupportedOperationException("RENAME: not in this test catalog");
    }

    /** A table: its schema and its rows (replaced whole at each commit). */
    static final class MemTable implements SupportsRead, SupportsWrite, SupportsRowLevelOperations {
        final String name;
        final StructType schema;
        volatile List<InternalRow> rows = Collections.emptyList();

        MemTable(String name, StructType schema) {
            this.name = name;
            this.schema = schema;
        }

        @Override
        public String name() {
            return name;
        }

        @Override
        @SuppressWarnings("deprecation")
        public StructType schema() {
            return schema;
        }

        @Override
        public Set<TableCapability> capabilities() {
            return EnumSet.of(TableCapability.BATCH_READ, TableCapability.BATCH_WRITE,
                              TableCapability.TRUNCATE);
        }

        @Override
        public ScanBuilder newScanBuilder(CaseInsensitiveStringMap options) {
            List<InternalRow> snapshot = rows;
            return () -> new MemScan(schema, snapshot);
        }

        @Override
        public WriteBuilder newWriteBuilder(LogicalWriteInfo info) {
            return new MemWriteBuilder(this, false);
        }

        @Override
        public RowLevelOperationBuilder newRowLevelOperationBuilder(RowLevelOperationInfo info) {
            return () -> new RowLevelOperation() {
                @Override
                public Command command() {
                    return info.command();
                }

                @Override
                public ScanBuilder newScanBuilder(CaseInsensitiveStringMap options) {
                    return MemTable.this.newScanBuilder(options);
                }

                @Override
                public WriteBuilder newWriteBuilder(LogicalWriteInfo writeInfo) {
                    return new MemWriteBuilder(MemTable.this, true); // the group: every row
                }
            };
        }
    }

    static final class MemScan implements Scan, Batch {
        final StructType schema;
        final List<InternalRow> rows;

        MemScan(StructType schema, List<InternalRow> rows) {
            this.schema = schema;
            this.rows = rows;
        }

        @Override
        public StructType readSchema() {
            return schema;
        }

        @Override
        public Batch toBatch() {
            return this;
        }

        @Override
        public InputPartition[] planInputPartitions() {
            return new InputPartition[] {new Part(new ArrayList<>(rows))};
        }

        @Override
        public PartitionReaderFactory createReaderFactory() {
            return new ReaderFactory();
        }
    }

    static final class ReaderFactory implements PartitionReaderFactory {
        @Override
        public PartitionReader<InternalRow> createReader(InputPartition partition) {
            List<InternalRow> list = ((Part) partition).rows;
            return new PartitionReader<InternalRow>() {
                int next = -1;

                @Override
                public boolean next() {
                    return ++next < list.size();
                }

                @Override
                public InternalRow get() {
                    return list.get(next);
                }

                @Override
                public void close() {
                }
            };
        }
    }

    /** The rows, sent to the task (which may see another copy of this class's statics). */
    static final class Part implements InputPartition {
        final ArrayList<InternalRow> rows;

        Part(ArrayList<InternalRow> rows) {
            this.rows = rows;
        }
    }

    /** A task's rows, sent back to the driver. */
    public static final class Done implements WriterCommitMessage {
        public final ArrayList<InternalRow> rows;

        Done(ArrayList<InternalRow> rows) {
            this.rows = rows;
        }

        /** The rows of a message, which the tasks' class loader may have made (a class of
         * the same name that this one cannot be cast to, after ADD JAR). */
        @SuppressWarnings("unchecked")
        static List<InternalRow> rowsOf(WriterCommitMessage message) {
            try {
                return (List<InternalRow>) message.getClass().getDeclaredField("rows").get(message);
            } catch (ReflectiveOperationException e) {
                throw new IllegalStateException(e);
            }
        }
    }

    /** Sent to the tasks: each sends its rows back in its commit message. */
    static final class WriterFactory implements DataWriterFactory {

        @Override
        public DataWriter<InternalRow> createWriter(int partitionId, long taskId) {
            return new DataWriter<InternalRow>() {
                final ArrayList<InternalRow> out = new ArrayList<>();

                @Override
                public void write(InternalRow row) {
                    out.add(row.copy());
                }

                @Override
                public WriterCommitMessage commit() {
                    return new Done(out);
                }

                @Override
                public void abort() {
                }

                @Override
                public void close() {
                }
            };
        }
    }

    static final class MemWriteBuilder implements WriteBuilder, SupportsTruncate {
        final MemTable table;
        boolean replace;

        MemWriteBuilder(MemTable table, boolean replace) {
            this.table = table;
            this.replace = replace;
        }

        @Override
        public WriteBuilder truncate() {
            replace = true;
            return this;
        }

        @Override
        public Write build() {
            boolean whole = replace;
            return new Write() {
                @Override
                public BatchWrite toBatch() {
                    return new BatchWrite() {
                        @Override
                        public DataWriterFactory createBatchWriterFactory(PhysicalWriteInfo info) {
                            return new WriterFactory();
                        }

                        @Override
                        public void commit(WriterCommitMessage[] messages) {
                            List<InternalRow> rows = new ArrayList<>(whole
                                    ? Collections.emptyList() : table.rows);
                            for (WriterCommitMessage message : messages) {
                                rows.addAll(Done.rowsOf(message));
                            }
                            table.rows = Collections.unmodifiableList(rows);
                        }

                        @Override
                        public void abort(WriterCommitMessage[] messages) {
                        }
                    };
                }
            };
        }
    }
}
