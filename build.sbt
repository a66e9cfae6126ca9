// The sparkgnn JVM module: native vector aggregates for the pushdown strategy and the step-metrics
// SparkListener (docs/ARCHITECTURE.md, "The JVM module"). Sources live in jvm/src/main/scala; `make jar`
// compiles the same sources offline with jvm/build.py (sbt cannot be installed on the build machines)
// and tests/test_build_sbt.py keeps the versions below equal to the pinned pyspark's.
//
//   sbt package   ->  build/sbt/scala-2.13/sparkgnn-jvm_2.13-0.1.0.jar
//   SPARKGNN_JAR=<that jar> makes the Python side use it instead of the one make builds.

ThisBuild / scalaVersion := "2.13.18"
ThisBuild / organization := "org.sparkgnn"
ThisBuild / version := "0.1.0"

val sparkVersion = "4.3.0"

lazy val root = (project in file("."))
  .settings(
    name := "sparkgnn-jvm",
    Compile / scalaSource := baseDirectory.value / "jvm" / "src" / "main" / "scala",
    Compile / unmanagedSourceDirectories := Seq((Compile / scalaSource).value),
    Compile / unmanagedResourceDirectories := Nil,
    Test / unmanagedSourceDirectories := Nil,
    target := baseDirectory.value / "build" / "sbt",
    scalacOptions ++= Seq("-deprecation", "-feature", "-release", "17"),
    libraryDependencies ++= Seq(
      "org.apache.spark" %% "spark-core" % sparkVersion % "provided",
      "org.apache.spark" %% "spark-sql" % sparkVersion % "provided"
    )
  )
