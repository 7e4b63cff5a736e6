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
 *
 * With the option path (spark.sql.catalog.NAME.path=DIR), each commit also writes the
 * table's schema and rows to a file in DIR (a new file renamed over the old: a commit is
 * there whole or not at all), and a table not in memory is read from there, so that the
 * tables outlive the driver (tests that kill it with SIGKILL).
 */
public class RowLevelCatalog implements TableCatalog {
    /** Every catalog's tables, by catalog name: one store for every session of the JVM (a
     * streaming query's foreachBatch runs in a clone of the session, with catalogs of its
     * own), as a format's storage is. */
    private static final Map<String, Map<Identifier, MemTable>> STORES = new ConcurrentHashMap<>();
    private Map<Identifier, MemTable> tables;

    private String name;
    /** Where this catalog keeps its tables across drivers; null: in memory only. */
    private java.io.File dir;

    @Override
    public void initialize(String name, CaseInsensitiveStringMap options) {
        this.name = name;
        this.tables = STORES.computeIfAbsent(name, n -> new ConcurrentHashMap<>());
        String path = options.get("path");
        if (path != null) {
            dir = new java.io.File(path);
            dir.mkdirs();
        }
    }

    java.io.File fileOf(Identifier ident) {
        if (dir == null) {
            return null;
        }
        // each part encoded, joined by "~", which URLEncoder always encodes
        List<String> parts = new ArrayList<>(java.util.Arrays.asList(ident.namespace()));
        parts.add(ident.name());
        StringBuilder id = new StringBuilder();
        for (String part : parts) {
            id.append(id.length() == 0 ? "" : "~").append(
                    java.net.URLEncoder.encode(part, java.nio.charset.StandardCharsets.UTF_8));
        }
        return new java.io.File(dir, id + ".table");
    }

    /** The table's schema and rows, to its file (if tables are kept). */
    static void persist(MemTable table) {
        java.io.File file = table.file;
        if (file == null) {
            return;
        }
        java.io.File tmp = new java.io.File(file.getPath() + ".tmp");
        try (java.io.ObjectOutputStream out = new java.io.ObjectOutputStream(
                new java.io.FileOutputStream(tmp))) {
            out.writeObject(table.schema.json());
            out.writeObject(new ArrayList<>(table.rows));
        } catch (java.io.IOException e) {
            throw new java.io.UncheckedIOException(e);
        }
        try {
            java.nio.file.Files.move(tmp.toPath(), file.toPath(),
                    java.nio.file.StandardCopyOption.ATOMIC_MOVE);
        } catch (java.io.IOException e) {
            throw new java.io.UncheckedIOException(e);
        }
    }

    @SuppressWarnings("unchecked")
    MemTable restore(Identifier ident) {
        java.io.File file = fileOf(ident);
        if (file == null || !file.exists()) {
            return null;
        }
        try (java.io.ObjectInputStream in = new java.io.ObjectInputStream(
                new java.io.FileInputStream(file))) {
            StructType schema = (StructType) org.apache.spark.sql.types.DataType.fromJson(
                    (String) in.readObject());
            MemTable table = new MemTable(ident, schema, file);
            table.rows = Collections.unmodifiableList((List<InternalRow>) in.readObject());
            return table;
        } catch (java.io.IOException | ClassNotFoundException e) {
            throw new IllegalStateException("cannot read " + file, e);
        }
    }

    @Override
    public String name() {
        return name;
    }

    @Override
    public Identifier[] listTables(String[] namespace) {
        return tables.keySet().stream()
                .filter(id -> java.util.Arrays.equals(id.namespace(), namespace))
                .toArray(Identifier[]::new);
    }

    @Override
    public Table loadTable(Identifier ident) throws NoSuchTableException {
        MemTable table = tables.get(ident);
        if (table == null) {
            table = restore(ident);
            if (table == null) {
                throw new NoSuchTableException(ident);
            }
            tables.putIfAbsent(ident, table);
            table = tables.get(ident);
        }
        return table;
    }

    @Override
    @SuppressWarnings("deprecation")
    public Table createTable(Identifier ident, StructType schema, Transform[] partitions,
                             Map<String, String> properties) throws TableAlreadyExistsException {
        MemTable table = new MemTable(ident, schema, fileOf(ident));
        if (restore(ident) != null || tables.putIfAbsent(ident, table) != null) {
            throw new TableAlreadyExistsException(ident.toString());
        }
        persist(table);
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
        MemTable altered = new MemTable(ident, schema, table.file);
        altered.rows = Collections.unmodifiableList(rows);
        tables.put(ident, altered);
        persist(altered);
        return altered;
    }

    @Override
    public boolean dropTable(Identifier ident) {
        java.io.File file = fileOf(ident);
        boolean onDisk = file != null && file.delete();
        return tables.remove(ident) != null || onDisk;
    }

    @Override
    public void renameTable(Identifier from, Identifier to) {
        throw new UnsupportedOperationException("RENAME: not in this test catalog");
    }

    /** A table: its schema and its rows (replaced whole at each commit). */
    static final class MemTable implements SupportsRead, SupportsWrite, SupportsRowLevelOperations {
        final String name;
        final StructType schema;
        final java.io.File file; // null: not kept
        volatile List<InternalRow> rows = Collections.emptyList();

        MemTable(Identifier ident, StructType schema, java.io.File file) {
            this.name = ident.toString();
            this.schema = schema;
            this.file = file;
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
                            persist(table);
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
